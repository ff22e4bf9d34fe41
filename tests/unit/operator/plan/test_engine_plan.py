"""engine_plan.plan_engines: one snapshot in, the pass's engine actions in their safe order and
the rollout report out. The rollout and the scaler plan over one state: the scaler sees the
rollout's relabels and deletions and never its surge pods."""

from __future__ import annotations

import copy
from typing import Any

from builders import NOW
from engine_snapshots import CACHE, WANT, engine, snapshot
from weightcache_operator.plan.actions import ApplyService, Create, Delete, Failover, SetRole, in_order
from weightcache_operator.plan.engine_plan import plan_engines
from weightcache_operator.render import daemon_spec_hash


def kinds(actions: list[Any]) -> list[tuple[str, str]]:
    return [(type(a).__name__, getattr(a, "name", "") or getattr(a, "serve", "")) for a in actions]


def test_a_ready_surge_is_relabelled_first_then_the_old_pods_drain_then_a_new_standby_is_created() -> None:
    state = snapshot(
        engine("a0", "active", version="old"), engine("s0", "standby", version="old"), engine("n0", "standby", age_s=30)
    )
    plan = plan_engines(CACHE, state, WANT, NOW, apply_service=False)
    assert kinds(plan.actions) == [("SetRole", "n0"), ("Delete", "a0"), ("Delete", "s0"), ("Create", "")]
    assert plan.actions[0] == SetRole("n0", "active")
    assert (
        isinstance(plan.actions[-1], Create)
        and plan.actions[-1].pod["metadata"]["labels"]["weightcache.io/role"] == "standby"
    )
    assert plan.rollout.phase == "Progressing" and plan.rollout.mode == "Engine"


def test_a_surge_that_is_not_ready_yet_is_neither_counted_nor_trimmed_by_the_scaler() -> None:
    state = snapshot(
        engine("a0", "active", version="old"),
        engine("s0", "standby", version="old"),
        engine("n0", "standby", ready=False, age_s=5),
    )
    plan = plan_engines(CACHE, state, WANT, NOW, apply_service=False)
    assert plan.actions == [], "two standbys for one wanted, yet the surge stays and nothing is created"
    assert "waiting for n0" in plan.rollout.step


def test_a_spec_change_applies_the_service_after_the_relabels_and_before_any_deletion() -> None:
    state = snapshot(engine("a0", "active", deleting=True), engine("s0", "standby"))
    plan = plan_engines(CACHE, state, WANT, NOW, apply_service=True)
    assert [type(a) for a in plan.actions] == [SetRole, Failover, ApplyService, Create]
    failover = plan.actions[1]
    assert isinstance(failover, Failover) and failover.promotion.failure is not None
    assert failover.promotion.failure.signal == "PodDeleted"
    assert plan.actions[2] == ApplyService(daemon_spec_hash(CACHE))


def test_a_converged_cache_plans_nothing_and_the_pods_given_stay_as_they_were() -> None:
    state = snapshot(engine("a0", "active"), engine("s0", "standby"))
    given = copy.deepcopy(state.engine_pods)
    plan = plan_engines(CACHE, state, WANT, NOW, apply_service=False)
    assert plan.actions == [] and plan.stranded == []
    assert state.engine_pods == given
    assert not any(isinstance(a, Delete) for a in plan.actions)


def test_relabels_to_active_precede_the_service_and_relabels_to_standby_follow_it() -> None:
    planned = [Delete("old", "rolled out"), SetRole("old", "standby"), ApplyService("h"), SetRole("new", "active")]
    assert in_order(planned) == [
        SetRole("new", "active"),
        ApplyService("h"),
        SetRole("old", "standby"),
        Delete("old", "rolled out"),
    ]
