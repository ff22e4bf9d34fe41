"""The seeding objects of a pass (``spec.daemon.seeding.mode: Peers``; render/seeding.py): the
credential Secret (created on full passes when missing), and the peers file as the cluster stands.

The peers are the cache's daemon pods of the current generation (the wanted daemon spec hash)
that are Ready on a Ready node and whose report is ready with every rank's weights digest: only
those can serve what a starting daemon of this generation would load. A pod on a node that is
not Ready may still look Ready for a minute (until the node controller marks it), and would cost
every daemon that asks it a stall. Peers on cordoned nodes come last, in the file and in every
assignment: a cordon is the first step of a drain, and that node may go away mid-seed (it is
still asked when no other node holds the ranks). Each node selected for the cache's daemons
without such a Ready daemon yet is assigned the peers holding its ranks, rotated round robin
over the new nodes (sorted by name), so N new nodes start from different seeds instead of all
asking the first. Everything is sorted: an unchanged world gives the same file, which the
executor does not write again.

The reports are the ones the daemon status reader already holds (``DaemonStatusReader.known``):
planning sends no HTTP request, so a slow daemon endpoint never delays the gates. A daemon whose
ready report arrives after planning is listed by the next pass, which the pass asks for
(``peers_behind``).
"""

from __future__ import annotations

from collections.abc import Mapping

from weightcache_contract.daemon_report import DaemonReport
from weightcache_contract.seeding import PEERS_FILE, SEED_PORT, SeedPeer, SeedPeers

from weightcache_operator.objects import Object, PodView, View
from weightcache_operator.observe.daemon_status import Fetched
from weightcache_operator.observe.failures import cordoned_nodes
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import Action, ApplySeedPeers, CreateSeedingSecret
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.render.seeding import seed_peers_configmap, uses_seeding
from weightcache_operator.render.topology import assign_slots, selected
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CacheRef, local_ranks

Reports = Mapping[str, Fetched]
"""Daemon pod uid (its name when it has none) → its last report, or why there is none."""


def plan_seeding(cache: WeightCache, snapshot: Snapshot, reports: Reports, *, apply: bool) -> list[Action]:
    """On a full pass (``apply``: creation, spec change, resync, taking over) the Secret's creation,
    which keeps an existing one: the operator may create Secrets, never read them, so it learns that
    one is missing (deleted to rotate it) only by creating it. The peers ConfigMap when its file
    differs from the live one (or on ``apply``: the executor then applies it only where any field
    differs). Nothing with ``mode: Off``."""
    if not uses_seeding(cache):
        return []
    actions: list[Action] = []
    if apply:
        actions.append(CreateSeedingSecret(CacheRef.of(cache).seeding_secret_name))
    wanted = seed_peers_configmap(cache, seed_peers(cache, snapshot, reports))
    if apply or not _same_file(snapshot.seed_peers, wanted):
        actions.append(ApplySeedPeers(wanted, snapshot.seed_peers))
    return actions


def peers_behind(cache: WeightCache, snapshot: Snapshot, reports: Reports) -> bool:
    """Whether the live peers file differs from what ``reports`` (read after the pass planned)
    say: the next pass should write it without waiting for another trigger."""
    if not uses_seeding(cache):
        return False
    return not _same_file(snapshot.seed_peers, seed_peers_configmap(cache, seed_peers(cache, snapshot, reports)))


def seed_peers(cache: WeightCache, snapshot: Snapshot, reports: Reports) -> SeedPeers:
    """The peers file: the Ready peers by node name, and each new node's peers in the order it
    should try them."""
    current = daemon_spec_hash(cache)
    unready = snapshot.unready_nodes()
    cordoned = cordoned_nodes(snapshot.nodes)
    peers: list[SeedPeer] = []
    ready_nodes: set[str] = set()
    for raw in snapshot.daemon_pods:
        pod = PodView(raw)
        if not (pod.ready and pod.node and pod.spec_hash == current) or pod.node in unready:
            continue
        ready_nodes.add(pod.node)
        report = reports.get(pod.uid or pod.name)
        peer = _peer(pod, report)
        if peer is not None:
            peers.append(peer)
    peers.sort(key=lambda p: (p.node in cordoned, p.node, p.address))
    return SeedPeers(peers=peers, assignments=_assignments(cache, snapshot, peers, ready_nodes, cordoned))


def _peer(pod: PodView, report: Fetched | None) -> SeedPeer | None:
    """The pod as a peer, when its report is ready and names every rank's weights digest."""
    if not isinstance(report, DaemonReport) or not report.ready or not report.ranks or not pod.ip or not pod.node:
        return None
    if any(not r.ready or not r.fingerprint for r in report.ranks):
        return None
    return SeedPeer(
        node=pod.node,
        address=pod.ip,
        port=SEED_PORT,
        ranks={r.rank: str(r.fingerprint) for r in sorted(report.ranks, key=lambda r: r.rank)},
        local_index={r.rank: i for i, r in enumerate(report.ranks)},
    )


def _assignments(
    cache: WeightCache, snapshot: Snapshot, peers: list[SeedPeer], ready_nodes: set[str], cordoned: frozenset[str]
) -> dict[str, list[str]]:
    """New node → the peers holding its ranks, rotated by the node's place among the new nodes
    that need the same ranks: new node i tries peer ``i mod M`` first, then the others in order;
    peers on cordoned nodes after them all, unrotated."""
    selected_nodes = sorted(View(n).name for n in snapshot.nodes if selected(cache.spec.placement, n))
    per_node = cache.spec.parallelism.nodes
    if per_node == 1:
        needs = {node: tuple(local_ranks(cache, 0)) for node in selected_nodes}
    else:
        slots = assign_slots(selected_nodes, per_node).slots
        needs = {node: tuple(local_ranks(cache, k)) for k, nodes in enumerate(slots) for node in nodes}
    turns: dict[tuple[int, ...], int] = {}
    assignments: dict[str, list[str]] = {}
    for node in sorted(needs):
        if node in ready_nodes:
            continue
        ranks = needs[node]
        holding = [p.node for p in peers if p.node != node and all(r in p.ranks for r in ranks)]
        if not holding:
            continue
        staying = [n for n in holding if n not in cordoned]
        leaving = [n for n in holding if n in cordoned]
        turn = turns.get(ranks, 0)
        turns[ranks] = turn + 1
        first = turn % len(staying) if staying else 0
        assignments[node] = staying[first:] + staying[:first] + leaving
    return assignments


def _same_file(live: Object | None, wanted: Object) -> bool:
    return live is not None and (live.get("data") or {}).get(PEERS_FILE) == wanted["data"][PEERS_FILE]
