"""The rollout's report: ``status.rollout`` and the conditions it sets."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from weightcache_operator.objects import truncated
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.strategy import Strategy
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.status import status_condition
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
    result: Plan,
    strategy: tuple[Strategy, str] | None,
    now: datetime,
    previous: Sequence[Condition],
    observed_generation: int | None,
) -> list[Condition]:
    """Conditions that replace or join ``aggregate``'s: ``Progressing`` False with reason
    ``RolloutStalled`` (as a Deployment's ``ProgressDeadlineExceeded``) when stalled, True while
    rolling; ``GenerationChange`` saying node by node or blue/green, and why. ``previous``: the
    conditions the pass read, which keep their transition times."""

    def make(kind: str, ok: bool, reason: str, message: str) -> Condition:
        return status_condition(kind, ok, reason, message[:32768], now, previous, observed_generation)

    out = []
    if result.stalled:
        out.append(make("Progressing", False, "RolloutStalled", result.stalled))
    elif result.phase == "Progressing":
        out.append(make("Progressing", True, f"{result.mode}Rollout", result.step))
    if result.mode == "Generation" and result.phase in ("Progressing", "Stalled") and strategy is not None:
        out.append(make("GenerationChange", True, strategy[0], strategy[1]))
    elif any(c.type == "GenerationChange" for c in previous):
        out.append(make("GenerationChange", False, "Converged", "every daemon holds the current generation"))
    return out
