"""A pass's status is the CRD's typed ``WeightCacheStatus`` from its first line: ``aggregate``
returns the model, the rooms after it (the rollout and engine start reports, the failover, the
InferencePool) hand back typed parts of it and change nothing, and ``completed`` adds those parts
on a copy, once per pass; the status written is exactly the one ``completed`` returned. A room
that patched the status after the fact (a dict, or the model handed on) fails here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from builders import BASE, changed, condition
from pass_world import World, serving
from pydantic import ValidationError
from weightcache_operator.plan.status_reports import RolloutReport, RoutingReport, StatusReports
from weightcache_operator.run import reconcile
from weightcache_operator.spec import (
    Condition,
    EngineStartStatus,
    FailoverStatus,
    InferencePoolStatus,
    RolloutStatus,
    WeightCacheStatus,
)

NEW_TEMPLATE = [{"name": "engine", "image": "e:2", "command": ["weightcache", "engine"]}]
"""A new engine template: a rollout."""


@dataclass
class Seen:
    """One pass's status as each step handed it on, with its wire at that moment."""

    aggregated: list[tuple[WeightCacheStatus, dict[str, Any]]] = field(default_factory=list)
    reports: list[StatusReports] = field(default_factory=list)
    completed: list[tuple[WeightCacheStatus, dict[str, Any]]] = field(default_factory=list)
    written: list[WeightCacheStatus] = field(default_factory=list)


def _watched(world: World, monkeypatch: pytest.MonkeyPatch) -> Seen:
    seen = Seen()
    aggregate, completed = reconcile.aggregate, reconcile.completed
    write_status = world.reconciler.reporter.write_status

    def aggregating(*args: Any, **kwargs: Any) -> WeightCacheStatus:
        status = aggregate(*args, **kwargs)
        seen.aggregated.append((status, status.wire()))
        return status

    def completing(status: WeightCacheStatus, reports: StatusReports) -> WeightCacheStatus:
        assert status is seen.aggregated[-1][0], "the reports join the status aggregate returned"
        done = completed(status, reports)
        seen.reports.append(reports)
        seen.completed.append((done, done.wire()))
        return done

    def writing(body: Any, typed: WeightCacheStatus, previous: WeightCacheStatus) -> None:
        seen.written.append(typed)
        write_status(body, typed, previous)

    monkeypatch.setattr(reconcile, "aggregate", aggregating)
    monkeypatch.setattr(reconcile, "completed", completing)
    monkeypatch.setattr(world.reconciler.reporter, "write_status", writing)
    return seen


def _typed(reports: StatusReports) -> None:
    assert isinstance(reports.rollout, RolloutReport) and isinstance(reports.routing, RoutingReport)
    assert reports.rollout.rollout is None or isinstance(reports.rollout.rollout, RolloutStatus)
    assert all(isinstance(c, Condition) for c in reports.rollout.conditions)
    assert reports.engine_start is None or isinstance(reports.engine_start, EngineStartStatus)
    assert reports.failover is None or isinstance(reports.failover, FailoverStatus)
    assert reports.routing.pool is None or isinstance(reports.routing.pool, InferencePoolStatus)
    assert reports.routing.condition is None or isinstance(reports.routing.condition, Condition)


def test_each_pass_adds_the_rooms_typed_reports_once_on_a_copy_and_writes_that_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = World(changed(BASE, routing={"inferencePool": {"mode": "Managed"}}))
    seen = _watched(world, monkeypatch)
    serving(world)
    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)
    world.run()
    world.change_spec(**{"engine.template.spec.containers": NEW_TEMPLATE})
    world.run(apply=True)
    surge = next(n for n in world.engines() if not world.api.stored("Pod", n)["spec"].get("nodeName"))
    world.scheduled(surge, "node-2")
    started = world.api.stored("Pod", surge)
    started["status"]["conditions"] = [condition("Ready", True, since=60)]  # timed: an engine start
    world.api.put("Pod", started)
    world.run()

    passes = len(seen.written)
    assert passes >= 6 and len(seen.aggregated) == len(seen.completed) == len(seen.reports) == passes
    for (aggregated, wire_then), (done, done_wire), written, reports in zip(
        seen.aggregated, seen.completed, seen.written, seen.reports, strict=True
    ):
        assert type(aggregated) is WeightCacheStatus and type(done) is WeightCacheStatus
        _typed(reports)
        assert aggregated.wire() == wire_then, "nothing changes the aggregate once it is handed on"
        assert written is done and written.wire() == done_wire, "the status written is the one completed"
        assert done is not aggregated, "the reports are added on a copy"
    # Every room reported at least once over the scenario, each through its typed part.
    assert any(r.engine_start is not None for r in seen.reports)
    assert any(r.failover is not None for r in seen.reports)
    assert any(r.rollout.rollout is not None and r.rollout.conditions for r in seen.reports)
    assert all(r.routing.pool is not None and r.routing.condition is not None for r in seen.reports)

    world.change_spec(**{"engine.args": ["--max-model-len", "512"]})  # not in the schema: nothing runs
    world.run(apply=True)
    assert len(seen.written) == passes + 1 and len(seen.completed) == passes
    assert type(seen.written[-1]) is WeightCacheStatus and seen.written[-1].phase == "Failed"


def test_the_status_model_is_changed_only_through_copies() -> None:
    status = WeightCacheStatus(phase="Ready", conditions=[Condition(type="Available", status="True")])

    with pytest.raises(ValidationError):
        status.phase = "Failed"  # type: ignore[misc]
    pool = status.merged(WeightCacheStatus(inference_pool=None))
    joined = pool.with_conditions([Condition(type="Available", status="False"), Condition(type="X", status="True")])

    assert status.wire() == {"phase": "Ready", "conditions": [{"type": "Available", "status": "True"}]}
    assert pool.wire() == {**status.wire(), "inferencePool": None}, "a field set to None is set: a delete"
    assert [(c.type, c.status) for c in joined.conditions] == [("Available", "False"), ("X", "True")]


def test_a_failover_is_written_whole_so_the_previous_ones_fields_do_not_survive_next_to_it() -> None:
    gone = FailoverStatus.model_validate({"time": "2026-12-04T10:26:22Z", "replica": 0, "to": "b", "promotionMs": 1})

    wire = WeightCacheStatus(last_failover=gone.whole()).wire()["lastFailover"]

    assert wire["from"] is None and wire["detectionMs"] is None and wire["to"] == "b"
    assert set(wire) == {f.alias or name for name, f in FailoverStatus.model_fields.items()}
