"""The daemons' DaemonSets of a cache, planned as actions (actions.py; executor.py applies them):
one (or one per node slot with ``parallelism.nodes > 1``), the GPU holder's that books their GPUs,
the DRA claim template their pods claim GPUs from; and, on a change of the daemon spec, the
decision between blue/green and node by node (taken once, recorded on the DaemonSets)."""

from __future__ import annotations

import logging

from weightcache_operator.objects import Object, View, spec_hash
from weightcache_operator.observe.daemon_status import DaemonStatusReader
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import Action, ApplyClaimTemplate, ApplyDaemonSet, DeleteDaemonSet, in_order
from weightcache_operator.plan.engine_plan import old_side, set_name
from weightcache_operator.plan.rollout.strategy import Strategy, generation_strategy
from weightcache_operator.render.daemon import blue_green_name, daemon_daemonsets
from weightcache_operator.render.dra import claim_template, uses_dra
from weightcache_operator.render.gpu_holder import (
    HOLDER_COMPONENT,
    blue_green_blocker,
    gpu_holder_daemonset,
    holder_name,
    reads_grant,
)
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.render.topology import assign_slots, selected
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import (
    COMPONENT_LABEL,
    SLOT_LABEL,
    STRATEGY_ANNOTATION,
    STRATEGY_REASON_ANNOTATION,
    CacheRef,
)

log = logging.getLogger("weightcache_operator.plan.daemonsets")


def plan_daemons(cache: WeightCache, snapshot: Snapshot, daemon_status: DaemonStatusReader) -> list[Action]:
    """The DaemonSet actions of a spec change or resync, in ``actions.ORDER``: with ``gpuAccess:
    dra`` first the ResourceClaimTemplate the daemons' pods claim GPUs from, on other GPU backends
    first the GPU holder DaemonSet that books their GPUs (deleted once no daemon DaemonSet reads
    its grant); the daemon DaemonSets (applied where they differ); deleting this cache's
    DaemonSets that are no longer wanted. Reads the daemons' reports only to decide a generation
    change's strategy (``_daemonset_for_spec``)."""
    ref = CacheRef.of(cache)
    actions: list[Action] = []
    slots: list[list[str]] = []
    if cache.spec.parallelism.nodes > 1:
        nodes = [View(n).name for n in snapshot.nodes if selected(cache.spec.placement, n)]
        slots = assign_slots(nodes, cache.spec.parallelism.nodes).slots
    if uses_dra(cache):
        actions.append(ApplyClaimTemplate(claim_template(cache)))
    listed = list(snapshot.daemonsets)
    live = {View(ds).name: ds for ds in listed}
    existing = snapshot.daemon_daemonsets
    grouped = cache.spec.parallelism.nodes > 1
    mine = [ds for ds in existing if (SLOT_LABEL in View(ds).labels) == grouped]
    name, annotations = _daemonset_for_spec(cache, mine, snapshot, daemon_status)
    wanted = daemon_daemonsets(cache, slots, name, annotations)
    holder = gpu_holder_daemonset(cache, slots)
    if holder is not None:
        actions.append(ApplyDaemonSet(holder, live.get(holder["metadata"]["name"]), holder=True))
    actions += [ApplyDaemonSet(ds, live.get(ds["metadata"]["name"])) for ds in wanted]
    names = {ds["metadata"]["name"] for ds in wanted}
    kept = list(wanted)
    for ds in existing:
        if View(ds).name in names:
            continue
        if ds in mine and old_side(ds, name, daemon_spec_hash(cache)):
            kept.append(ds)
            continue  # a blue/green change's old side: the rollout deletes it once drained
        actions.append(DeleteDaemonSet(View(ds).name, "layout changed"))
    holder_live = any(View(ds).labels.get(COMPONENT_LABEL) == HOLDER_COMPONENT for ds in listed)
    if holder is None and holder_live and not any(reads_grant(ds) for ds in kept):
        # No GPUs booked through a holder any more (cpu-shm, dra), and no daemon left on them.
        actions.append(DeleteDaemonSet(holder_name(ref), "no GPU holder needed"))
    return in_order(actions)


def _daemonset_for_spec(
    cache: WeightCache, daemonsets: list[Object], snapshot: Snapshot, daemon_status: DaemonStatusReader
) -> tuple[str, dict[str, str]]:
    """Which DaemonSet holds the wanted daemon spec — with ``nodes > 1``, the base name of its
    set of slot DaemonSets (``<base>-<slot>``) — and how its change was decided. The decision is
    taken once, when no DaemonSet holds the wanted spec yet: blue/green starts a second
    DaemonSet or set (``blue_green_name``), node by node updates the newest in place. It is
    recorded on the DaemonSets, so later passes (and a restarted operator) carry on the same way
    even as the daemons' free memory changes under them."""
    wanted_hash = daemon_spec_hash(cache)
    current = next((ds for ds in daemonsets if spec_hash(ds) == wanted_hash), None)
    if current is not None:
        kept = {
            k: v for k, v in View(current).annotations.items() if k in (STRATEGY_ANNOTATION, STRATEGY_REASON_ANNOTATION)
        }
        return set_name(current), kept
    if not daemonsets:
        return CacheRef.of(cache).daemon_name, {}
    strategy, why = _choose_strategy(cache, daemonsets, snapshot, daemon_status)
    newest = max(daemonsets, key=lambda ds: (View(ds).created_text, View(ds).name))
    name = blue_green_name(cache) if strategy == "BlueGreen" else set_name(newest)
    log.info(
        "daemon spec change",
        extra={"cache": CacheRef.of(cache).name, "strategy": strategy, "reason": why, "daemonset": name},
    )
    return name, {STRATEGY_ANNOTATION: strategy, STRATEGY_REASON_ANNOTATION: why[:1024]}


def _choose_strategy(
    cache: WeightCache, daemonsets: list[Object], snapshot: Snapshot, daemon_status: DaemonStatusReader
) -> tuple[Strategy, str]:
    """``generation_strategy`` over fresh reports of the serving daemons, once the state is
    clean enough for a second daemon spec: DaemonSets of one spec whose pods all run it (a
    change still under way is finished node by node, so no node ever runs two daemons of one
    spec on one socket directory)."""
    ref = CacheRef.of(cache)
    pods = snapshot.daemon_pods
    hashes = {spec_hash(ds) for ds in daemonsets}
    if len(hashes) > 1 or any(spec_hash(p) not in hashes for p in pods):
        return "NodeByNode", "a previous generation change is still under way"
    reports = daemon_status.read((ref.namespace, ref.name), pods, refresh=True)
    return generation_strategy(
        cache.spec.daemon.generation_change,
        cache.spec.daemon.backend,
        reports,
        gpu_access=cache.spec.engine.gpu_access,
        gpus_shared=blue_green_blocker(cache, pods, snapshot.holder_pods),
    )
