"""An engine rollout (rollout.planner.plan), pods as the API server returns them in, actions out: a surge
standby per replica, promoted once Ready, the old pods drained, the next replica only once the first is
whole; complete until something is outdated again."""

from __future__ import annotations

from builders import NOW
from rollout_pods import DAEMONS, WANT, engine, held, old_pair
from weightcache_operator.plan.rollout.decisions import promoted, retired
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.status import rollout_status
from weightcache_operator.spec import RolloutStatus


def test_nothing_outdated_is_no_rollout() -> None:
    result = plan(WANT, old_pair(0, "new") + old_pair(1, "new"), DAEMONS, "g1", NOW, None, 2)
    assert (result.mode, result.phase, result.create, promoted(result), retired(result)) == (None, None, [], [], [])
    assert rollout_status(result, WANT, NOW, None) is None


def test_the_first_replica_gets_a_surge_standby_and_the_second_waits() -> None:
    result = plan(WANT, old_pair(0) + old_pair(1), DAEMONS, "g1", NOW, None, 2)
    assert (result.mode, result.phase, result.create) == ("Engine", "Progressing", [0])
    assert promoted(result) == [] and retired(result) == [] and result.updated == 0
    typed = rollout_status(result, WANT, NOW, None)
    assert typed is not None
    status = typed.wire()
    assert (status["updated"], status["total"], status["engineTemplateHash"]) == (0, 2, "new")
    assert "replica 0" in status["currentStep"]


def test_an_unready_surge_is_held_and_waited_for() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby", ready=False), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert held(result) == {"n0"}, "the scaler must not trim the surge as a second standby"
    assert (result.create, promoted(result), retired(result), result.stalled) == ([], [], [], None)


def test_a_ready_surge_is_promoted_and_the_old_pods_drained() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby"), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert promoted(result) == ["n0"] and sorted(retired(result)) == ["a0", "s0"]
    assert held(result) == set(), "the promoted pod is the replica's active: the scaler must count it"
    assert not {"a1", "s1"} & set(retired(result)), "one replica at a time"


def test_the_next_replica_starts_only_when_the_first_is_whole() -> None:
    draining = [engine("n0", 0, "active"), engine("a0", 0, "active", "old", deleting=True), *old_pair(1)]
    result = plan(WANT, draining, DAEMONS, "g1", NOW, None, 2)
    assert (result.create, retired(result)) == ([], []) and "draining" in result.step
    restoring = [engine("n0", 0, "active"), engine("m0", 0, "standby", ready=False), *old_pair(1)]
    assert plan(WANT, restoring, DAEMONS, "g1", NOW, None, 2).create == []
    whole = [engine("n0", 0, "active"), engine("m0", 0, "standby"), *old_pair(1)]
    result = plan(WANT, whole, DAEMONS, "g1", NOW, None, 2)
    assert (result.create, result.updated) == ([1], 1)


def test_complete_stays_complete_until_something_is_outdated() -> None:
    done = RolloutStatus.model_validate(
        {"phase": "Complete", "engineTemplateHash": "new", "finishedAt": "2026-11-29T09:00:00Z"}
    )
    scaling = [engine("n0", 0, "active"), engine("m0", 0, "standby", ready=False)]
    result = plan(WANT, scaling, DAEMONS, "g1", NOW, done, 2)
    assert result.phase == "Complete" and rollout_status(result, WANT, NOW, done) == done
