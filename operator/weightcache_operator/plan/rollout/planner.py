"""One rollout pass: observed pods and the desired versions in, the next steps and the rollout's
phase out (``plan``). Pure."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from weightcache_operator.objects import Object, PodView, stamp
from weightcache_operator.plan.actions import ApplyService, in_order
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.rollout.decisions import Plan, promoted, retired
from weightcache_operator.plan.rollout.engine import plan_engine
from weightcache_operator.plan.rollout.generation import plan_generation, serve_hash
from weightcache_operator.plan.rollout.views import DaemonView, Desired, EngineView, engine_views, replica_done
from weightcache_operator.spec import RolloutStatus
from weightcache_operator.vocabulary import ROLE_LABEL


def plan(
    want: Desired,
    engines: list[Object],
    daemons: list[Object],
    serving: str | None,
    now: datetime,
    previous: RolloutStatus | None = None,
    desired_nodes: int = 0,
    old_daemonsets: dict[str, str | None] | None = None,
    *,
    size: int = 1,
    settling: bool = False,
    apply_service: bool = False,
) -> Plan:
    """Decides the next actions and reports the rollout. ``serving``: the generation the live
    Service selects (None when there is no Service yet or it selects none); ``previous``: the
    last ``status.rollout``; ``desired_nodes``: how many daemon pods the DaemonSet of the wanted
    generation should run; ``old_daemonsets``: name → generation of DaemonSets kept for another
    generation next to it (a blue/green change's old side); ``size``: pods per engine
    (``parallelism.nodes``); ``settling``: the Service switched generation less than
    ``SWITCH_SETTLE_SECONDS`` ago; ``apply_service``: apply the Service even when its generation
    does not change (spec changes, resync).

    Engines are units (engine_units.py), each seen as one ``EngineView``: every decision (surge,
    promote, drain, which generation the Service selects, which replicas are whole, the stall) is
    made over those views alike for every size. Only replacing daemon pods node by node is for
    single-pod engines: slot DaemonSets roll their own pods."""
    pods = engine_views(want, engines, size)
    result = Plan(serve_hash=serve_hash(want, pods, serving))
    result.switching = settling or (serving is not None and serving != result.serve_hash)
    result.updated = sum(replica_done(want, pods, r) for r in range(want.replicas))
    nodes = [DaemonView.of(p) for p in daemons]
    old_sets = old_daemonsets or {}
    result.mode = _change(want, pods, nodes, old_sets)
    held: set[str] = set()
    if result.mode == "Generation":
        plan_generation(want, pods, nodes, result, held, now, desired_nodes, old_sets, size)
    elif result.mode == "Engine":
        plan_engine(want, pods, result, held, now, size)
    if apply_service or serving != result.serve_hash:
        result.actions.append(ApplyService(result.serve_hash))
    result.actions = in_order(result.actions)
    result.units = units(_after(engines, result, now), size, held=held)
    undone = next((r for r in range(want.replicas) if not replica_done(want, pods, r)), None)
    loading = len(nodes) < desired_nodes or any(not d.ready for d in nodes)
    settle_phase(result, previous, undone, daemons_loading=loading)
    return result


def _after(engines: list[Object], result: Plan, now: datetime) -> list[Object]:
    """The engine pods as ``result``'s relabels and deletions leave them (copies)."""
    promote, retire = set(promoted(result)), set(retired(result))
    out = []
    for pod in engines:
        view = PodView(pod)
        if view.name in promote:
            pod = {**pod, "metadata": {**pod["metadata"], "labels": {**view.labels, ROLE_LABEL: "active"}}}
        if view.name in retire and not view.deleting:
            pod = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": stamp(now)}}
        out.append(pod)
    return out


def _change(
    want: Desired, pods: list[EngineView], nodes: list[DaemonView], old_sets: dict[str, str | None]
) -> Literal["Engine", "Generation"] | None:
    """A generation change (any daemon, engine or kept DaemonSet of another generation) or an
    engine rollout (an engine of another template), or neither."""
    if (
        old_sets
        or any(d.daemon_hash != want.daemon_hash for d in nodes)
        or any(p.daemon_hash != want.daemon_hash for p in pods)
    ):
        return "Generation"
    if any(p.engine_hash != want.engine_hash for p in pods):
        return "Engine"
    return None


def settle_phase(
    result: Plan, previous: RolloutStatus | None, undone: int | None, *, daemons_loading: bool = False
) -> None:
    """``result.phase`` (and, after a rollout, its mode and step): Stalled or Progressing while a
    rollout ``result.mode`` is under way; once nothing outdated is left, Progressing until every
    replica is whole again (``undone``: the first that is not) and, after a generation change,
    until every node's new daemon is Ready (``daemons_loading``: node by node replaces the last
    node's daemon after its engines moved), then Complete, which stays until the next rollout."""
    was = previous.phase if previous is not None else None
    mode = previous.mode if previous is not None else None
    if result.mode is not None:
        result.phase = "Stalled" if result.stalled else "Progressing"
    elif was in ("Progressing", "Stalled"):
        loading = mode == "Generation" and daemons_loading
        result.phase = "Progressing" if undone is not None or loading else "Complete"
        result.step = (
            f"replica {undone}: restoring Ready engines"
            if undone is not None
            else "waiting for the new generation's daemons to load on every node"
            if loading
            else "every replica updated"
        )
        result.mode = mode
    elif was == "Complete":
        result.phase, result.mode, result.step = "Complete", mode, "every replica updated"
