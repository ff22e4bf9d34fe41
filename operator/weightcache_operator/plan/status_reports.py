"""What the rooms after the aggregate report for the status, and the one step that adds it.

A pass computes the status in two pure steps, as Kuberay's controllers do: ``aggregate``
(status.py) from what the pass observed, then ``completed`` with what carrying out the actions
reported (act/report.py: the rollout and the engine starts; act/executor.py: the failover and
the InferencePool). Each report is a typed part of ``WeightCacheStatus``; ``completed`` adds them
on a copy, so the status a pass writes is built in one place and nothing changes it afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

from weightcache_operator.spec import (
    Condition,
    EngineStartStatus,
    FailoverStatus,
    InferencePoolStatus,
    RolloutStatus,
    WeightCacheStatus,
)

__all__ = ["RolloutReport", "RoutingReport", "StatusReports", "completed"]


@dataclass(frozen=True)
class RolloutReport:
    """``status.rollout`` and the conditions the rollout sets (rollout/status.py)."""

    rollout: RolloutStatus | None = None
    """None until a rollout has happened: the field is then left as it was."""
    conditions: tuple[Condition, ...] = ()
    """Each replaces the aggregate's condition of its type (Progressing), else joins."""


@dataclass(frozen=True)
class RoutingReport:
    """``status.inferencePool`` and the InferencePoolReady condition (act/routing.py)."""

    pool: InferencePoolStatus | None = None
    """Always written: None (a merge patch's delete) once routing is off."""
    condition: Condition | None = None


@dataclass(frozen=True)
class StatusReports:
    """Everything a pass adds to the aggregate, each part typed."""

    rollout: RolloutReport = RolloutReport()
    engine_start: EngineStartStatus | None = None
    """The latest engine start this pass saw; None leaves ``lastEngineStart`` as it was."""
    failover: FailoverStatus | None = None
    """The last failover this pass carried out, with every field set (FailoverStatus.whole)."""
    routing: RoutingReport = RoutingReport()


def completed(status: WeightCacheStatus, reports: StatusReports) -> WeightCacheStatus:
    """The status the pass writes: ``status`` (left unchanged) with the reports added."""
    update: dict[str, object] = {"inference_pool": reports.routing.pool}
    if reports.rollout.rollout is not None:
        update["rollout"] = reports.rollout.rollout
    if reports.engine_start is not None:
        update["last_engine_start"] = reports.engine_start
    if reports.failover is not None:
        update["last_failover"] = reports.failover
    routed = (reports.routing.condition,) if reports.routing.condition is not None else ()
    return status.model_copy(update=update).with_conditions([*reports.rollout.conditions, *routed])
