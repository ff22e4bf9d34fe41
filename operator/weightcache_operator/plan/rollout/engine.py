"""Engine rollout: the engine template changed, the daemons did not. Up to ``maxSurge`` replicas
roll at once, each by surge → Ready → promote and drain the old active → replace the standbys."""

from __future__ import annotations

from datetime import datetime

from weightcache_operator.plan.rollout.decisions import Plan, check_deadline, promote, retire
from weightcache_operator.plan.rollout.views import Desired, EngineView, preference, replica_done


def plan_engine(want: Desired, pods: list[EngineView], result: Plan, held: set[str], now: datetime, size: int) -> None:
    """Adds the engine rollout's steps to ``result``, and its surge units to ``held``."""
    # The first ``max_surge`` replicas that are not whole, for every size: a rollout never holds
    # more than ``max_surge`` extra engines (for groups, ``nodes`` pods' worth of node capacity
    # each), and one that stalls has started at most that many surges of a template that may not
    # work. A slot frees as soon as any of them is whole, not when all are.
    undone = [r for r in range(want.replicas) if not replica_done(want, pods, r)]
    if not undone:
        # Only pods of replicas beyond ``replicas`` are outdated; scaling removes them.
        result.step = "removing pods of scaled-down replicas"
        return
    steps = {r: _roll_replica(want, pods, r, result, held, now, size) for r in undone[: want.max_surge]}
    if result.stalled:
        # No further surge while a new-version engine is stuck: the template may be what is wrong.
        # The replicas already under way go on, so that no more old and new engines coexist than
        # necessary, and each of them keeps its Ready active until its own surge is Ready.
        for replica in result.create:
            steps[replica] = f"replica {replica}: not started while the rollout is stalled"
        result.create = []
    result.step = "; ".join(steps.values())


def _roll_replica(
    want: Desired, pods: list[EngineView], replica: int, result: Plan, held: set[str], now: datetime, size: int
) -> str:
    """One replica's next step, added to ``result``: surge → wait Ready → promote + drain the
    old active → old standbys out, new ones in (created by the ordinary scaling) → Ready.
    Returns what it is doing, for ``currentStep``."""
    mine = [p for p in pods if p.replica == replica]
    live = [p for p in mine if not p.deleting]
    new = sorted((p for p in live if p.engine_hash == want.engine_hash), key=preference)
    old_live = [p for p in live if p.engine_hash != want.engine_hash]
    active = next((p for p in live if p.role == "active"), None)
    if active is None:
        return f"replica {replica}: waiting for an active engine"
    if active.engine_hash != want.engine_hash:
        if not new:
            result.create.append(replica)
            return f"replica {replica}: starting a new-version standby"
        surge = new[0]
        held.add(surge.name)
        if not surge.ready:
            check_deadline(want, surge, now, result, size > 1)
            return f"replica {replica}: waiting for {surge.name} to turn Ready"
        promote(result, surge)
        held.discard(surge.name)  # active from now on: the scaler must see it
        retire(result, old_live)
        return f"replica {replica}: promoted {surge.name}, draining {active.name}"
    if old_live:
        retire(result, old_live)
        return f"replica {replica}: retiring old standbys"
    if any(p.engine_hash != want.engine_hash for p in mine):
        return f"replica {replica}: waiting for old engines to finish draining"
    for pod in new:
        if not pod.ready:
            check_deadline(want, pod, now, result, size > 1)
    return f"replica {replica}: waiting for new standbys to turn Ready"
