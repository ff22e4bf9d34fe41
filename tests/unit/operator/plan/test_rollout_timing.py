"""A rollout's time per replica (operator/weightcache_operator/rollout_timing.py): the new engine's
start, its promotion and the old engines' drain, carried from pass to pass in status.rollout."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from builders import NOW
from rollout_pods import WANT, engine
from weightcache_operator.plan.actions import Delete, SetRole
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout_timing import replica_timings
from weightcache_operator.spec import RolloutStatus


def rolling(**entries: Any) -> RolloutStatus:
    wire = {"phase": "Progressing", "engineTemplateHash": WANT.engine_hash, "daemonSpecHash": WANT.daemon_hash}
    return RolloutStatus.model_validate({**wire, **entries})


def test_a_promotion_records_the_new_engine_s_start_and_the_operator_s_reaction() -> None:
    surge = engine("n0", 0, "standby", age_s=20, ready_after_s=15)
    old = [engine("a0", 0, "active", "old"), engine("s0", 0, "standby", "old")]
    steps = Plan(
        serve_hash="g1",
        actions=[SetRole("n0", "active"), Delete("a0", "rolled out"), Delete("s0", "rolled out")],
    )
    [typed] = replica_timings(rolling(), steps, WANT, [surge, *old], NOW)
    entry = typed.wire()
    assert entry == {
        "replica": 0,
        "engine": "n0",
        "promotedAt": "2026-11-29T10:00:00.000Z",
        "startSeconds": 15,
        "promotionSeconds": 5,
        "retiredAt": "2026-11-29T10:00:00.000Z",
    }, "no drainSeconds while the old engines are still there"
    RolloutStatus.model_validate({"phase": "Progressing", "replicas": [entry]})


def test_the_drain_ends_when_the_replica_s_last_old_engine_is_gone_terminating_ones_included() -> None:
    new = engine("n0", 0, "active")
    before = rolling(replicas=[{"replica": 0, "engine": "n0", "retiredAt": "2026-11-29T09:59:50.250Z"}])
    draining = [new, engine("a0", 0, "active", "old", deleting=True)]
    assert "drainSeconds" not in replica_timings(before, Plan(serve_hash="g1"), WANT, draining, NOW)[0].wire()
    [done] = replica_timings(before, Plan(serve_hash="g1"), WANT, [new], NOW)
    assert done.wire()["drainSeconds"] == 9.75
    later = replica_timings(rolling(replicas=[done]), Plan(serve_hash="g1"), WANT, [new], NOW + timedelta(seconds=30))
    assert [e.wire() for e in later] == [done.wire()], "measured once, then kept"


def test_a_new_rollout_starts_a_new_list_and_replicas_are_listed_in_order() -> None:
    entry = {"replica": 1, "engine": "x", "retiredAt": "2026-11-29T09:00:00.000Z", "drainSeconds": 3.0}
    other_target = rolling(engineTemplateHash="older", replicas=[entry])
    assert replica_timings(other_target, Plan(serve_hash="g1"), WANT, [], NOW) == []
    surge = engine("n0", 0, "standby", age_s=8, ready_after_s=6)
    steps = Plan(serve_hash="g1", actions=[SetRole("n0", "active")])
    listed = replica_timings(rolling(replicas=[entry]), steps, WANT, [surge], NOW)
    assert [(e.replica, e.engine) for e in listed] == [(0, "n0"), (1, "x")]
    assert "retiredAt" not in listed[0].wire(), "nothing of replica 0 was retired in this pass"


def test_a_generation_change_counts_engines_of_the_old_generation_as_old() -> None:
    new = engine("n0", 0, "active", generation="g1")
    old_gen = engine("a0", 0, "active", generation="g0")
    before = rolling(replicas=[{"replica": 0, "engine": "n0", "retiredAt": "2026-11-29T09:59:59.000Z"}])
    assert "drainSeconds" not in replica_timings(before, Plan(serve_hash="g1"), WANT, [new, old_gen], NOW)[0].wire()
    assert replica_timings(before, Plan(serve_hash="g1"), WANT, [new], NOW)[0].wire()["drainSeconds"] == 1.0
