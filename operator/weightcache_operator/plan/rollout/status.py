"""The rollout's report: ``status.rollout`` and the conditions it sets."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from weightcache_operator.objects import condition, stamp
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.strategy import Strategy
from weightcache_operator.plan.rollout.views import Desired


def rollout_status(
    result: Plan, want: Desired, now: datetime, previous: dict[str, Any] | None
) -> dict[str, Any] | None:
    """``status.rollout``, or None when no rollout has happened yet. ``startedAt`` is kept while
    the target stays the same; ``finishedAt`` is stamped once, when the rollout completes."""
    if result.phase is None:
        return None
    before = previous or {}
    same_target = before.get("engineTemplateHash") == want.engine_hash
    if result.phase == "Complete" and before.get("phase") == "Complete":
        return (
            before
            if same_target
            else {**before, "engineTemplateHash": want.engine_hash, "updated": want.replicas, "total": want.replicas}
        )
    started = before.get("startedAt") if same_target and before.get("startedAt") else stamp(now)
    body: dict[str, Any] = {
        "phase": result.phase,
        "mode": result.mode,
        "engineTemplateHash": want.engine_hash,
        "daemonSpecHash": want.daemon_hash,
        "updated": result.updated,
        "total": want.replicas,
        "currentStep": result.step,
        "startedAt": started,
    }
    if result.stalled:
        body["message"] = result.stalled
    if result.phase == "Complete":
        body["finishedAt"] = stamp(now)
    return {k: v for k, v in body.items() if v is not None}


def rollout_conditions(
    result: Plan,
    strategy: tuple[Strategy, str] | None,
    now: datetime,
    previous: list[dict[str, Any]],
    observed_generation: int | None,
) -> list[dict[str, Any]]:
    """Conditions that replace or join ``aggregate``'s: ``Progressing`` False with reason
    ``RolloutStalled`` (as a Deployment's ``ProgressDeadlineExceeded``) when stalled, True while
    rolling; ``GenerationChange`` saying node by node or blue/green, and why."""

    def make(kind: str, ok: bool, reason: str, message: str) -> dict[str, Any]:
        return condition(kind, ok, reason, message[:32768], now, previous, observedGeneration=observed_generation)

    out = []
    if result.stalled:
        out.append(make("Progressing", False, "RolloutStalled", result.stalled))
    elif result.phase == "Progressing":
        out.append(make("Progressing", True, f"{result.mode}Rollout", result.step))
    if result.mode == "Generation" and result.phase in ("Progressing", "Stalled") and strategy is not None:
        out.append(make("GenerationChange", True, strategy[0], strategy[1]))
    elif any(c.get("type") == "GenerationChange" for c in previous):
        out.append(make("GenerationChange", False, "Converged", "every daemon holds the current generation"))
    return out
