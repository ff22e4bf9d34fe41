"""Engines as units (engine_units.units, views.unit_view): an engine of one pod is a unit of one, seen as
its pod is."""

from __future__ import annotations

from rollout_pods import WANT, engine
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.rollout.views import EngineView, engine_views, unit_view


def test_an_engine_of_one_pod_is_seen_as_a_unit_of_one_whose_view_is_its_pod_s() -> None:
    pods = [
        engine("a0", 0, "active", "old", deleting=True),
        engine("n0", 0, "standby", ready=False),
        engine("s0", 0, "standby"),
        engine("x0", 0, "standby", "old", ready=False, node="node-2"),
    ]
    as_units = [unit_view(WANT, u) for u in units(pods, 1)]
    assert [u.name for u in units(pods, 1)] == ["a0", "n0", "s0", "x0"]
    assert sorted(as_units, key=lambda v: v.name) == [EngineView.of(p) for p in pods]
    assert engine_views(WANT, list(reversed(pods)), 1) == [EngineView.of(p) for p in reversed(pods)], (
        "pods keep the order they are given"
    )
