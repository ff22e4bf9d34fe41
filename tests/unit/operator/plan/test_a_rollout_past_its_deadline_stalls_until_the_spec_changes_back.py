"""A new engine version not Ready by its deadline stalls the rollout with the old engines serving, and
changing the spec back retires the broken pod and completes."""

from __future__ import annotations

from builders import NOW
from rollout_pods import DAEMONS, WANT, engine, held, old_pair
from weightcache_operator.plan.rollout.decisions import promoted, retired
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.status import rollout_conditions, rollout_status
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.spec import RolloutStatus


def test_a_new_version_not_ready_by_the_deadline_stalls_and_keeps_the_old_serving() -> None:
    pods = [*old_pair(0), engine("n0", 0, "standby", ready=False, age_s=61), *old_pair(1)]
    result = plan(WANT, pods, DAEMONS, "g1", NOW, None, 2)
    assert result.phase == "Stalled" and result.stalled and "n0" in result.stalled
    assert "readyDeadlineSeconds" in result.stalled and "change it back" in result.stalled
    assert (result.create, promoted(result), retired(result)) == ([], [], [])
    assert held(result) == {"n0"}, "kept for its logs, not counted as a standby"
    conditions = rollout_conditions(result, NOW, [], 4)
    assert [(c.type, c.status, c.reason) for c in conditions] == [("Progressing", "False", "RolloutStalled")]
    status = rollout_status(result, WANT, NOW, None)
    assert status is not None and status.phase == "Stalled" and status.message == result.stalled


def test_changing_the_spec_back_retires_the_broken_pod_and_completes() -> None:
    back = Desired(engine_hash="old", daemon_hash="g1", replicas=2, standbys=1, ready_deadline_s=60)
    pods = [*old_pair(0), engine("n0", 0, "standby", "new", ready=False, age_s=300), *old_pair(1)]
    previous = RolloutStatus.model_validate(
        {"phase": "Stalled", "engineTemplateHash": "new", "startedAt": "2026-11-29T09:00:00Z"}
    )
    result = plan(back, pods, DAEMONS, "g1", NOW, previous, 2)
    assert retired(result) == ["n0"] and promoted(result) == [] and result.stalled is None
    after = plan(back, [*old_pair(0), *old_pair(1)], DAEMONS, "g1", NOW, rollout_status(result, back, NOW, previous), 2)
    assert after.phase == "Complete"
    rolling = {"phase": "Progressing", "engineTemplateHash": "old", "startedAt": "2026-11-29T09:59:00Z"}
    typed = rollout_status(after, back, NOW, RolloutStatus.model_validate(rolling))
    assert typed is not None
    status = typed.wire()
    assert status["finishedAt"] == "2026-11-29T10:00:00Z"
    assert status["startedAt"] == "2026-11-29T09:59:00Z" and (status["updated"], status["total"]) == (2, 2)
