"""The engines' plan for one pass: a snapshot and what the spec asks for in, actions (actions.py)
and the rollout report out. Pure.

Two planners meet here, one after the other, over one vocabulary:

- the rollout (``rollout.plan``, over engines of one pod or of ``parallelism.nodes`` pods alike)
  moves replicas to the wanted engine template and daemon spec hash, reports how far it got, and
  says which generation the Service selects; the steps of engine groups are ``plan_groups``'s;
- scaling and failover (failover.py per replica, ``plan_groups`` for groups) keep exactly
  ``replicas`` actives and ``standbysPerReplica`` standbys per replica, promoting a standby over
  a failed active.

Scaling plans over the engines as the rollout's relabels and deletions leave them, minus the
rollout's surge pods (``Plan.held``), which it must neither count nor trim. Pods the rollout
creates are not seen by it: they count from the next pass on, once the rollout has placed them.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .actions import Action, ApplyService, Create, Delete, DeleteDaemonSet, Failover, ReplaceDaemon, SetRole, in_order
from .failover import plan_replica
from .group_plan import plan_groups
from .objects import Object, PodView, spec_hash, stamp
from .placement import new_engine
from .render.daemon import slot_base
from .render.dra import engine_claim_current
from .render.engine import Role, engine_template_hash
from .render.layout import GROUP_LABEL, REPLICA_LABEL, ROLE_LABEL, SLOT_LABEL, daemon_spec_hash
from .rollout import Desired, Plan, plan
from .snapshot import Snapshot
from .spec import WeightCache


@dataclass
class EnginePlan:
    actions: list[Action]
    """In the order they are carried out (actions.ORDER)."""
    rollout: Plan
    """The rollout's report: mode, phase, step, replicas updated, why it stalled."""
    stranded: list[str] = field(default_factory=list)
    """Replicas whose active failed with no Ready standby to take over (the Degraded condition)."""
    desired_nodes: int = 0
    """Nodes the daemon DaemonSets of the wanted spec should run on."""


def desired(cache: WeightCache) -> Desired:
    engine = cache.spec.engine
    return Desired(
        engine_hash=engine_template_hash(cache),
        daemon_hash=daemon_spec_hash(cache),
        replicas=engine.replicas,
        standbys=engine.standbys_per_replica,
        ready_deadline_s=engine.rollout.ready_deadline_seconds,
    )


def set_name(daemonset: Object) -> str:
    """What names a generation's daemons: the DaemonSet's name, or a slot DaemonSet's base."""
    return slot_base(daemonset) if SLOT_LABEL in daemonset["metadata"]["labels"] else str(daemonset["metadata"]["name"])


def old_side(daemonset: Object, wanted: str, daemon_hash: str) -> bool:
    """A DaemonSet of another daemon spec hash than ``daemon_hash`` that a blue/green change left
    next to the wanted one (``wanted``: its ``set_name``): kept until drained."""
    return spec_hash(daemonset) != daemon_hash and set_name(daemonset) != wanted


def plan_engines(
    cache: WeightCache,
    snapshot: Snapshot,
    want: Desired,
    now: datetime,
    *,
    apply_service: bool,
    unresponsive: Mapping[str, datetime] | None = None,
    new_group: Callable[[], str] = lambda: secrets.token_hex(3),
) -> EnginePlan:
    """The pass's actions for the engines and the Service. ``apply_service``: apply the Service
    even when its generation does not change (spec changes, resync); ``unresponsive``: engines
    the operator's own probes found silent (responsiveness.py); ``new_group``: a new engine
    group's id."""
    current_sets = snapshot.daemonsets_of(want.daemon_hash)
    # A blue/green change's old side: DaemonSets of another generation next to the current one.
    old_sets = {
        ds["metadata"]["name"]: spec_hash(ds)
        for ds in snapshot.daemon_daemonsets
        if current_sets and old_side(ds, set_name(current_sets[0]), want.daemon_hash)
    }
    desired_nodes = sum(
        (ds.get("status") or {}).get("desiredNumberScheduled", 0) for ds in current_sets or snapshot.daemon_daemonsets
    )
    engines, serving, size = snapshot.engine_pods, snapshot.serving, cache.spec.parallelism.nodes
    steps = plan(
        want,
        engines,
        snapshot.daemon_pods,
        serving,
        now,
        snapshot.previous_rollout,
        desired_nodes,
        old_sets,
        size=size,
    )
    ready = snapshot.ready_daemons_by_slot(want.daemon_hash, size)
    actions: list[Action] = [SetRole(name, "active") for name in steps.promote]
    if apply_service or serving != steps.serve_hash:
        actions.append(ApplyService(steps.serve_hash))
    actions += [Delete(name, "rolled out") for name in steps.retire]
    load = Counter(PodView(p).node for p in engines if not PodView(p).deleting)
    for replica in steps.create:
        pod = new_engine(cache, replica, "standby", ready.get(0, {}), load)
        if pod is not None:
            actions.append(Create(pod))
    if steps.replace_daemon:
        actions.append(ReplaceDaemon(steps.replace_daemon))
    actions += [DeleteDaemonSet(name) for name in steps.retire_daemonsets]

    after = [p for p in _after(engines, steps, now) if PodView(p).name not in steps.held]
    stranded: list[str] = []
    if size > 1:
        actions += plan_groups(
            cache,
            after,
            ready,
            new_group,
            snapshot.unready_nodes(),
            steps.serve_hash,
        )
    else:
        scaled, stranded = _scale(cache, after, ready.get(0, {}), snapshot.unready_nodes(), unresponsive)
        actions += scaled
    return EnginePlan(in_order(actions), steps, stranded, desired_nodes)


def _after(engines: list[Object], steps: Plan, now: datetime) -> list[Object]:
    """The engine pods as the rollout's relabels and deletions leave them (copies)."""
    out = []
    for pod in engines:
        name = PodView(pod).name
        if name in steps.promote:
            pod = {**pod, "metadata": {**pod["metadata"], "labels": {**PodView(pod).labels, ROLE_LABEL: "active"}}}
        if name in steps.retire and not PodView(pod).deleting:
            pod = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": stamp(now)}}
        out.append(pod)
    return out


def _scale(
    cache: WeightCache,
    pods: list[Object],
    ready: Mapping[str, Object],
    unready: Mapping[str, datetime | None],
    unresponsive: Mapping[str, datetime] | None,
) -> tuple[list[Action], list[str]]:
    """Single-node engines: exactly ``replicas`` actives and ``standbysPerReplica`` standbys per
    replica, each replica's decisions (failover included) failover.plan_replica's. New pods go
    only to nodes whose daemon is Ready (``ready``); while there is none, nothing is created."""
    spec = cache.spec.engine
    actions: list[Action] = []
    gone: set[str] = set()
    for raw in pods:
        pod = PodView(raw)
        if pod.deleting:
            continue
        label = pod.labels.get(REPLICA_LABEL, "")
        if not label.isdigit() or int(label) >= spec.replicas:
            why = "scaled down" if label.isdigit() else "no replica label"
        elif GROUP_LABEL in pod.labels:
            why = "part of a multi-node engine; parallelism.nodes is 1 now"
        elif pod.node is not None and pod.node in ready and not engine_claim_current(raw, ready[pod.node]):
            why = "its node's daemon was replaced: the engine's ResourceClaim is stale"
        else:
            continue
        actions.append(Delete(pod.name, why))
        gone.add(pod.name)
    kept = [p for p in pods if PodView(p).name not in gone]
    load = Counter(PodView(p).node for p in kept if not PodView(p).deleting)
    stranded: list[str] = []
    for replica in range(spec.replicas):
        mine = [p for p in kept if PodView(p).replica == replica]
        step = plan_replica(replica, mine, spec.standbys_per_replica, daemon_spec_hash(cache), unready, unresponsive)
        if step.promotion is not None:
            actions += [SetRole(PodView(step.promotion.promoted).name, "active"), Failover(step.promotion)]
        actions += [SetRole(PodView(p).name, "standby") for p in step.demote]
        actions += [Delete(PodView(p).name, why) for p, why in step.delete]
        if step.stranded:
            stranded.append(step.stranded)
        if not ready:
            continue
        roles: list[Role] = ["active"] if step.create_active else []
        roles += ["standby"] * step.create_standbys
        for role in roles:
            new = new_engine(cache, replica, role, ready, load)
            if new is not None:
                actions.append(Create(new))
    return actions, stranded
