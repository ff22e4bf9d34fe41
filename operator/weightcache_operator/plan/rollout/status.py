"""The rollout's report: ``status.rollout`` and the conditions it sets."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from weightcache_operator.objects import truncated
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.strategy import Strategy
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.status import ChangeUnderWay, status_condition
from weightcache_operator.spec import Condition, RolloutStatus


def rollout_status(result: Plan, want: Desired, now: datetime, previous: RolloutStatus | None) -> RolloutStatus | None:
    """``status.rollout``, or None when no rollout has happened yet. ``startedAt`` is kept while
    the target stays the same; ``finishedAt`` is stamped once, when the rollout completes. Only
    the fields it has are set (``wire`` writes those), as on the previous one it goes on from."""
    if result.phase is None:
        return None
    same_target = previous is not None and previous.engine_template_hash == want.engine_hash
    if result.phase == "Complete" and previous is not None and previous.phase == "Complete":
        if same_target:
            return previous
        return previous.model_copy(
            update={"engine_template_hash": want.engine_hash, "updated": want.replicas, "total": want.replicas}
        )
    started = previous.started_at if same_target and previous is not None else None
    fields: dict[str, Any] = {
        "phase": result.phase,
        "mode": result.mode,
        "engine_template_hash": want.engine_hash,
        "daemon_spec_hash": want.daemon_hash,
        "updated": result.updated,
        "total": want.replicas,
        "current_step": result.step,
        "started_at": started or truncated(now),
    }
    if result.stalled:
        fields["message"] = result.stalled
    if result.phase == "Complete":
        fields["finished_at"] = truncated(now)
    return RolloutStatus(**{k: v for k, v in fields.items() if v is not None})


def rollout_conditions(
    result: Plan, now: datetime, previous: Sequence[Condition], observed_generation: int | None
) -> list[Condition]:
    """The ``Progressing`` condition that replaces ``aggregate``'s: False with reason
    ``RolloutStalled`` (as a Deployment's ``ProgressDeadlineExceeded``) when stalled, True while
    rolling. ``previous``: the conditions the pass read, which keep their transition times.
    (``GenerationChange`` is ``aggregate``'s, from ``change_under_way``: the phase depends on it.)"""

    def make(kind: str, ok: bool, reason: str, message: str) -> Condition:
        return status_condition(kind, ok, reason, message[:32768], now, previous, observed_generation)

    if result.stalled:
        return [make("Progressing", False, "RolloutStalled", result.stalled)]
    if result.phase == "Progressing":
        return [make("Progressing", True, f"{result.mode}Rollout", result.step)]
    return []


def change_under_way(result: Plan, want: Desired, strategy: tuple[Strategy, str] | None) -> ChangeUnderWay | None:
    """The daemon generation change ``result`` reports under way, or None. Under way from the
    pass that first sees a daemon or engine of another generation until the rollout completes:
    through the old generation's last drain and the new generation's standbys turning Ready
    (``settle_phase`` keeps the mode and ``Progressing`` until every replica is whole), so the
    change does not end, and the phase flip, while standbys start. ``strategy``: how it was decided
    (``act.report.strategy_decision``), None when no DaemonSet records it."""
    if result.mode != "Generation" or result.phase not in ("Progressing", "Stalled"):
        return None
    kind, why = strategy if strategy is not None else ("Unrecorded", "")
    return ChangeUnderWay(kind, why, result.step, result.updated, want.replicas, result.stalled)
