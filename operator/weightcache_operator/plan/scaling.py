"""Scaling and failover for engines of any size, one pass: engine pods in, actions (create,
delete, relabel, failover) out. Pure, so every rule is unit-tested without an API server;
executor.py carries the actions out (engine_plan.py puts them in ``actions.ORDER``).

An engine is a unit (engine_units.py): one pod with ``parallelism.nodes = 1``, a group of
``nodes`` pods otherwise — a single-pod engine is a group of one. Each replica gets exactly one
active unit and ``standbysPerReplica`` standby units, decided by ``failover.plan_replica``;
this module adds what the shape of a unit asks for:

- a unit that does not fit the spec (a scaled-down replica, a pod of the other size, a stale
  ResourceClaim) is deleted whole;
- a group is created leader first: the other node ranks dial the leader's rendezvous at its pod
  IP, which exists only once the leader pod is running, so they are created in a later pass (the
  leader's pod event triggers it), against the same leader, with the unit's role;
- a new unit starts only once every slot it needs has a Ready daemon of the current generation
  (with ``nodes = 1`` slot 0 is every node), so an engine never waits on a daemon that is not
  there, and a group never starts with a rank that has nowhere to go.

Units the rollout holds (its surge units, ``Unit.held``) are neither counted nor trimmed here;
their missing ranks are still created.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping
from datetime import datetime

from weightcache_operator.objects import Object, PodView
from weightcache_operator.plan.actions import Action, Create, Delete, Failover, SetRole
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.failover import plan_replica
from weightcache_operator.plan.placement import new_engine
from weightcache_operator.render.dra import engine_claim_current
from weightcache_operator.render.engine import DIST_PORT, DIST_PORT_ANNOTATION, Member, Role
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import GROUP_LABEL


def plan_scaling(
    cache: WeightCache,
    engines: list[Unit],
    ready: Mapping[int, Mapping[str, Object]],
    new_group: Callable[[], str],
    unready_nodes: Mapping[str, datetime | None] | None = None,
    unresponsive: Mapping[str, datetime] | None = None,
    surge: list[int] | None = None,
    cordoned: Collection[str] = frozenset(),
) -> tuple[list[Action], list[str]]:
    """The actions for the units ``engines`` (terminating ones included; ``held`` ones are the
    rollout's surge units) and the replicas left stranded (an active failed with no Ready standby
    to take over: the Degraded condition). ``ready[k]``: node → current Ready daemon pod, for the
    nodes holding slot ``k``; ``unready_nodes``: as failures.unready_nodes; ``unresponsive``:
    engines the operator's own probes found silent; ``surge``: replicas that get a new surge unit
    (a standby of the new version) from the rollout; ``cordoned``: unschedulable nodes, where
    no new pod goes (a drain would evict it) and an active hands over (failover.plan_replica)."""
    spec = cache.spec.engine
    size = cache.spec.parallelism.nodes
    unready = unready_nodes or {}
    actions: list[Action] = []
    pods = [pod for unit in engines for pod in unit.pods]
    live = [p for p in pods if not PodView(p).deleting]
    load = Counter(PodView(p).node for p in live)
    # Terminating groups included: their ranks hold the port until they exit, a preStop sleep
    # and a drain after the deletion.
    ports = {_port(p) for p in pods}
    roles: dict[str, str] = {}
    """Pod name → the role this plan gives it (the pods themselves are left as given)."""

    def role_of(unit: Unit) -> str | None:
        return roles.get(unit.name, unit.role)

    def relabel(unit: Unit, role: str) -> None:
        for pod in map(PodView, unit.pods):
            if pod.deleting:
                continue
            if roles.get(pod.name, pod.role) != role:
                actions.append(SetRole(pod.name, role))
            roles[pod.name] = role

    def delete(unit: Unit, why: str) -> None:
        actions.extend(Delete(PodView(p).name, why) for p in unit.pods if not PodView(p).deleting)

    # Where new pods may go: a node with a Ready daemon that is not cordoned.
    placeable = {k: {n: d for n, d in nodes.items() if n not in cordoned} for k, nodes in ready.items()}

    def create(replica: int, role: Role, member: Member | None = None) -> None:
        rank = member.node_rank if member is not None else 0
        pod = new_engine(cache, replica, role, placeable.get(rank, {}), load, member)
        if pod is not None:
            actions.append(Create(pod))

    def new_unit(replica: int, role: Role) -> None:
        if not all(placeable.get(k) for k in range(size)):
            return
        if size == 1:
            create(replica, role)
            return
        # A group's rendezvous port: the lowest no group of the cache holds (pods sharing a
        # network namespace would collide on one; a follower could even join the wrong group).
        port = next(p for p in range(DIST_PORT, DIST_PORT + 10_000) if p not in ports)
        ports.add(port)
        create(replica, role, Member(new_group(), 0, port=port))

    def add_ranks(unit: Unit) -> None:
        """A group's missing ranks, against its leader once the leader has a pod IP."""
        leader = unit.leader
        ip = (leader.get("status") or {}).get("podIP") if leader is not None else None
        if leader is None or not ip or unit.deleting:
            return
        group = PodView(leader).labels.get(GROUP_LABEL, "")
        for rank in range(1, size):
            if rank not in unit.members:
                create(int(unit.replica), _role(role_of(unit)), Member(group, rank, ip, _port(leader)))

    mine: dict[int, list[Unit]] = {}
    removed: dict[int, list[tuple[Unit, str]]] = {}
    for unit in engines:
        why = _misfit(unit, spec.replicas, size, ready)
        if why is not None:
            delete(unit, why)
            if unit.replica.isdigit():
                removed.setdefault(int(unit.replica), []).append((unit, why))
            continue
        if not unit.deleting:
            relabel(unit, role_of(unit) or "standby")  # a group's pods follow their leader's role
        if unit.held:
            add_ranks(unit)
            continue
        mine.setdefault(int(unit.replica), []).append(unit)

    for replica in surge or []:
        new_unit(replica, "standby")
    stranded: list[str] = []
    for replica in range(spec.replicas):
        found = mine.get(replica, [])
        step = plan_replica(
            replica,
            found,
            spec.standbys_per_replica,
            daemon_spec_hash(cache),
            unready,
            unresponsive,
            removed.get(replica, ()),
            cordoned,
        )
        if step.promotion is not None:
            promoted = next(u for u in found if u.head is step.promotion.promoted)
            relabel(promoted, "active")
            # Every promotion is a Failover action, with or without a failure: the reporter
            # records, counts and posts only those over a failure, and logs a swap for an
            # active that never got Ready, so no promotion goes unlogged.
            actions.append(Failover(step.promotion))
        for unit in step.demote:
            relabel(unit, "standby")
        gone = {id(u) for u, _ in step.delete}
        for unit, why in step.delete:
            delete(unit, why)
        for unit in found:
            if id(unit) not in gone:
                add_ranks(unit)
        if step.stranded:
            stranded.append(step.stranded)
        if step.create_active:
            new_unit(replica, "active")
        for _ in range(step.create_standbys):
            new_unit(replica, "standby")
    return actions, stranded


def _misfit(unit: Unit, replicas: int, size: int, ready: Mapping[int, Mapping[str, Object]]) -> str | None:
    """Why a unit must go whole whatever its role, or None."""
    if not unit.replica.isdigit():
        return "no replica label"
    if int(unit.replica) >= replicas:
        return "scaled down"
    if size > 1 and unit.key.startswith("pod/"):
        return "not a member of an engine group"
    if size == 1 and GROUP_LABEL in PodView(unit.head).labels:
        return "part of a multi-node engine; parallelism.nodes is 1 now"
    for slot, pod in unit.members.items():
        node = PodView(pod).node
        daemon = ready.get(slot, {}).get(node) if node else None
        if daemon is not None and not PodView(pod).deleting and not engine_claim_current(pod, daemon):
            return "its node's daemon was replaced: the engine's ResourceClaim is stale"
    return None


def _port(pod: Object) -> int:
    text = (pod["metadata"].get("annotations") or {}).get(DIST_PORT_ANNOTATION, "")
    return int(text) if text.isdigit() else DIST_PORT


def _role(role: str | None) -> Role:
    return "active" if role == "active" else "standby"
