"""Engine starts as the operator reads them from pod objects (operator/weightcache_operator/engine_start.py),
their histogram (metrics.py), Event and status (report.py). Pods here are shaped as the API server
returns them; the e2e test (tests/e2e/test_engine_start_e2e.py) reads real ones."""

from __future__ import annotations

from typing import Any

from builders import condition, container_status, engine
from weightcache_contract.prometheus import STARTUP_BUCKETS
from weightcache_operator.act.metrics import OperatorMetrics
from weightcache_operator.observe.engine_start import StartWatch, engine_start, latest, slow_after, slow_message
from weightcache_operator.spec import EngineStartStatus


def pod(
    name: str = "tiny-0-abc",
    *,
    scheduled: float | None = 1,
    started: list[float | None] | None = None,
    ready: float | None = 14,
    restarts: int = 0,
) -> dict[str, Any]:
    """A standby engine pod created at NOW; each phase ends the given seconds later (None: not yet)."""
    containers = [
        container_status(
            f"c{i}", started=s, waiting=None if s is not None else "PodInitializing", restarts=restarts if i == 0 else 0
        )
        for i, s in enumerate(started if started is not None else [3])
    ]
    return engine(
        name,
        role="standby",
        created=0,
        ready=ready is not None,
        ready_since=ready or 0,
        conditions=[condition("PodScheduled", True, since=scheduled)] if scheduled is not None else [],
        containers=containers,
    )


def test_a_ready_pod_s_start_is_each_phase_s_end_in_seconds_since_its_creation() -> None:
    start = engine_start(pod(scheduled=1, started=[3, 5], ready=14))
    assert start is not None
    assert start.seconds == {"scheduled": 1, "started": 5, "ready": 14}, "the last container's start counts"
    assert (start.total, start.replica, start.node, start.restarts) == (14, 0, "node-1", 0)


def test_a_pod_not_ready_yet_has_no_start() -> None:
    assert engine_start(pod(ready=None)) is None


def test_phases_a_pod_does_not_show_are_left_out_and_stamps_never_run_backwards() -> None:
    # No PodScheduled condition, one container still waiting: only Ready is known.
    assert engine_start(pod(scheduled=None, started=[3, None], ready=9)).seconds == {"ready": 9}  # type: ignore[union-attr]
    # Whole-second stamps taken apart can invert: a phase never ends after Ready or before the one before it.
    start = engine_start(pod(scheduled=4, started=[2], ready=3))
    assert start is not None and start.seconds == {"scheduled": 3, "started": 3, "ready": 3}


def test_a_start_is_slow_from_half_the_rollout_deadline_and_the_event_says_where_the_time_went() -> None:
    assert slow_after(600) == 300
    start = engine_start(pod(started=[3], ready=40, restarts=2))
    assert start is not None
    message = slow_message(start, 60)
    assert "took 40s from creation to Ready after 2 container restart(s)" in message
    assert "scheduled 1s, started 3s, ready 40s" in message and "slow from 30s" in message
    status = start.status(slow_after(60)).wire()
    assert status["slow"] is True and status["readySeconds"] == 40 and status["restarts"] == 2
    assert start.status(slow_after(600)).wire()["slow"] is False
    EngineStartStatus.model_validate(status)  # what the CRD schema (generated from it) accepts


def test_each_start_is_counted_once_and_starts_before_the_first_pass_not_at_all() -> None:
    watch = StartWatch()
    early, late = pod("tiny-0-a", ready=10), pod("tiny-0-b", ready=None)
    assert watch.new_starts("c", [early, late]) == [], "already Ready when first seen: started before this operator"
    late_ready = pod("tiny-0-b", ready=20)
    assert [s.pod for s in watch.new_starts("c", [early, late_ready])] == ["tiny-0-b"]
    assert watch.new_starts("c", [early, late_ready]) == [], "not again on the next pass"
    flipped = pod("tiny-0-b", ready=50)  # Ready lost and regained (a readiness probe): no new start
    assert watch.new_starts("c", [early, flipped]) == []
    watch.forget("c")
    assert watch.new_starts("c", [early, late_ready]) == [], "forgotten: the next pass is a first pass again"


def test_new_starts_come_oldest_first_and_the_latest_is_the_last_to_turn_ready() -> None:
    watch = StartWatch()
    watch.new_starts("c", [])
    starts = watch.new_starts("c", [pod("b", ready=30), pod("a", ready=12)])
    assert [s.pod for s in starts] == ["a", "b"]
    assert latest(starts).pod == "b" and latest([]) is None  # type: ignore[union-attr]


def test_the_histogram_observes_every_phase_of_a_start_in_start_buckets() -> None:
    metrics = OperatorMetrics()
    start = engine_start(pod(scheduled=1, started=[3], ready=200))
    assert start is not None
    metrics.engine_started("ns", "tiny", start)
    text = metrics.render()
    series = 'weightcache_operator_engine_start_seconds_bucket{cache="tiny",namespace="ns",phase="ready",le="%s"} %s'
    assert series % ("180", "0") in text and series % ("300", "1") in text, text
    assert 'weightcache_operator_engine_start_seconds_sum{cache="tiny",namespace="ns",phase="started"} 3' in text
    assert 'weightcache_operator_engine_start_seconds_count{cache="tiny",namespace="ns",phase="scheduled"} 1' in text
    assert text.count("weightcache_operator_engine_start_seconds_bucket{") == 3 * (len(STARTUP_BUCKETS) + 1)
    # Other histograms keep the latency buckets.
    metrics.pass_done("ns", "tiny", "ok", 0.02)
    assert 'weightcache_operator_reconcile_seconds_bucket{cache="tiny",namespace="ns",outcome="ok",le="0.025"} 1' in (
        metrics.render()
    )
