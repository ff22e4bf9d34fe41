"""Generation change: what the daemons hold changed. New-generation engines start next to the old
ones, the Service switches once (``serve_hash``), the old engines drain, and the old daemons go:
node by node, or blue/green by deleting the old generation's DaemonSets."""

from __future__ import annotations

from datetime import datetime

from weightcache_operator.plan.actions import DeleteDaemonSet, ReplaceDaemon
from weightcache_operator.plan.rollout.decisions import Plan, check_deadline, promote, retire
from weightcache_operator.plan.rollout.views import DaemonView, Desired, EngineView, preference

SWITCH_SETTLE_SECONDS = 1.0
"""How long after switching the Service the old generation's engines stay, serving what still
reaches them (Plan.switching); the operator asks for a pass when it is over."""


def serve_hash(want: Desired, pods: list[EngineView], serving: str | None) -> str:
    """The generation the Service selects: the old one until the new one has a Ready engine
    already labelled active for every replica, then the new one, in a single switch — earlier
    only if the old one has no Ready active left while the new one has a Ready engine (switching
    gains something). The switch is never taken back: neither generation serving (an overloaded
    node's daemon flapping) is not a reason to move to one that cannot serve either, and an old
    active may recover.

    Why labelled active *before* the switch (``plan_generation`` promotes the new engines in an
    earlier pass, while the Service still selects the old generation): the EndpointSlice
    controller watches Services and pods separately. A relabel and a selector change sent
    back to back can reach it in the other order, and it then computes the new selector against
    the old labels — no endpoint at all until the relabel arrives (seen in the blue/green e2e)."""
    if serving is None or serving == want.daemon_hash:
        return want.daemon_hash
    ready_new = {p.replica for p in pods if p.daemon_hash == want.daemon_hash and p.ready and not p.deleting}
    active_new = {
        p.replica
        for p in pods
        if p.daemon_hash == want.daemon_hash and p.ready and not p.deleting and p.role == "active"
    }
    new_everywhere = all(r in active_new for r in range(want.replicas))
    old_serves = any(p.daemon_hash == serving and p.role == "active" and p.ready for p in pods)
    return want.daemon_hash if new_everywhere or (not old_serves and ready_new) else serving


def plan_generation(
    want: Desired,
    pods: list[EngineView],
    nodes: list[DaemonView],
    result: Plan,
    held: set[str],
    now: datetime,
    desired_nodes: int,
    old_sets: dict[str, str | None],
    size: int,
) -> None:
    """New-generation engines next to Ready new-generation daemons; the Service switches once
    every replica has a Ready new-generation engine; then the old engines drain. Node by node
    (old daemon pods of the DaemonSet updated in place): drain a node → replace its daemon.
    Blue/green (``old_sets``): the old DaemonSets go once no engine of their generation is left.
    Units the scaler must neither count nor trim go to ``held``."""
    new_nodes = sorted(d.node for d in nodes if d.node and d.ready and d.daemon_hash == want.daemon_hash)
    # Retire only once the Service selected the new generation before this pass (result.switching).
    switched = result.serve_hash == want.daemon_hash and not result.switching
    for replica in range(want.replicas):
        live = [p for p in pods if p.replica == replica and not p.deleting]
        new = sorted(
            (p for p in live if p.daemon_hash == want.daemon_hash and p.engine_hash == want.engine_hash),
            key=preference,
        )
        active = next((p for p in live if p.role == "active" and p.daemon_hash == want.daemon_hash), None)
        if active is not None:
            if switched:
                retire(result, [p for p in live if p.daemon_hash != want.daemon_hash])
            else:
                # Promoted ahead of the switch, next to the old active: hidden from the scaler,
                # which would demote one of two actives (serve_hash says why this order).
                held.add(active.name)
            continue
        if not new:
            if new_nodes:
                result.create.append(replica)
            continue
        held.add(new[0].name)
        if not new[0].ready:
            check_deadline(want, new[0], now, result, size > 1)
            continue
        promote(result, new[0])
        if switched:  # the old generation serves nothing: no reason to wait a pass
            held.discard(new[0].name)
            retire(result, [p for p in live if p.daemon_hash != want.daemon_hash])
    if result.stalled:
        # Nothing more moves while stalled, for every size: the old generation's DaemonSets stay
        # the way back if the spec is changed back.
        return
    if old_sets:
        retire_old_daemonsets(want, pods, result, old_sets)
    if size > 1:
        # Slot DaemonSets roll their pods by themselves: every group spans every slot, so no node
        # can be drained while the others serve, and there is no node to pick here.
        if not old_sets:
            result.step = result.step or "the slot DaemonSets replace their daemons; moving engine groups over"
        return
    # What the DaemonSet updated in place still runs of an older generation (none with blue/green).
    in_place = [d for d in nodes if d.owner not in old_sets]
    old = [d for d in in_place if d.daemon_hash != want.daemon_hash]
    settling = [d for d in in_place if not d.ready] or len(in_place) < desired_nodes
    if not old:
        if not old_sets:
            result.step = "new daemons on every node; moving engines over"
        return
    if settling:
        result.step = "waiting for the replaced daemon to load"
        return
    if result.switching:
        result.step = "switching the Service to the new generation; the old engines drain next"
        return  # what still serves the old generation drains once the switch has settled
    # The node whose drain costs the least serving capacity first.
    serving = result.serve_hash

    def serving_actives(node: str | None) -> int:
        return sum(p.node == node and p.role == "active" and p.ready and p.daemon_hash == serving for p in pods)

    target = min(old, key=lambda d: (serving_actives(d.node), d.node or ""))
    if serving_actives(target.node) and new_nodes:
        # New-generation engines are on their way elsewhere; drain this node after the switch.
        result.step = f"waiting for new-generation engines before draining {target.node}"
        return
    on_node = [p for p in pods if p.node == target.node and p.daemon_hash != want.daemon_hash]
    retire(result, [p for p in on_node if not p.deleting])
    if on_node:
        result.step = f"draining engines on {target.node}"
        return
    result.actions.append(ReplaceDaemon(target.name))
    result.step = f"replacing the daemon on {target.node}"


def retire_old_daemonsets(want: Desired, pods: list[EngineView], result: Plan, old_sets: dict[str, str | None]) -> None:
    """Blue/green's last step: an old generation's DaemonSet goes once the Service has switched
    away from it and none of its engines is left (draining ones included: they still map it)."""
    if result.serve_hash != want.daemon_hash:
        ready = sum(
            any(p.replica == r and p.daemon_hash == want.daemon_hash and p.ready for p in pods)
            for r in range(want.replicas)
        )
        result.step = f"blue/green: new-generation engines Ready for {ready}/{want.replicas} replicas; old ones serve"
        return
    drained = []
    for name, old_hash in sorted(old_sets.items()):
        left = [p.name for p in pods if p.daemon_hash == old_hash]
        if left:
            result.step = f"blue/green: draining {len(left)} engines of the old generation"
        else:
            drained.append(name)
    result.actions += [DeleteDaemonSet(name, "blue/green: old generation drained") for name in drained]
    if drained:
        result.step = f"blue/green: deleting the old generation's DaemonSet {', '.join(drained)}"
