"""failover.py's per-replica plan: which standby a failed active hands over to, when the replica keeps
its active and says Degraded, and the states an operator killed mid-failover leaves behind, each
converged without a second promotion."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from builders import NOW, at, make
from replica_plans import HASH, plan_replica, running_engine
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.spec import WeightCacheStatus


def names(pods: list[Any]) -> list[str]:
    return [p if isinstance(p, str) else p.name if isinstance(p, Unit) else p["metadata"]["name"] for p in pods]


def test_healthy_replica_needs_nothing() -> None:
    plan = plan_replica(
        0, [running_engine("a", role="active"), running_engine("s", role="standby", created=1)], 1, HASH, {}
    )
    assert (plan.promotion, plan.demote, plan.delete, plan.create_active, plan.create_standbys, plan.stranded) == (
        None,
        [],
        [],
        False,
        0,
        None,
    )


@pytest.mark.parametrize("signal", ["deleted", "restarted", "readiness", "gate", "node"])
def test_each_signal_promotes_the_ready_standby_retires_the_active_and_asks_for_a_replacement(signal: str) -> None:
    active = running_engine("a", role="active", ready=signal == "node", started=1, ready_since=60)
    unready: dict[str, datetime | None] = {}
    if signal == "deleted":
        active["metadata"]["deletionTimestamp"] = at(90)
    elif signal == "restarted":
        active["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(60)}}
    elif signal == "gate":
        active["status"]["conditions"][1]["status"] = "False"
    elif signal == "node":
        unready = {"node-1": NOW}
    standby = running_engine("s", role="standby", node="node-2", created=1)
    plan = plan_replica(0, [active, standby], 1, HASH, unready)
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s"]
    assert plan.promotion.failed is active and plan.promotion.failure is not None
    retired = names([p for p, _ in plan.delete])
    assert retired == ([] if signal == "deleted" else ["a"])  # a deleted pod is on its way out already
    assert plan.create_standbys == 1 and not plan.create_active and plan.stranded is None


def test_an_unresponsive_active_swaps_roles_with_an_answering_standby() -> None:
    """A verdict that may be wrong (slow, not hung) costs a role swap: the silent active is
    demoted, not deleted, and stays the replica's standby, so no new one is made."""
    active, standby = running_engine("a", role="active"), running_engine("s", role="standby", node="node-2", created=1)
    silent = {"a": NOW + timedelta(seconds=70)}
    plan = plan_replica(0, [active, standby], 1, HASH, {}, silent)
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s"]
    assert plan.promotion.failure is not None and plan.promotion.failure.signal == "Unresponsive"
    assert names(plan.demote) == ["a"] and plan.delete == [] and plan.create_standbys == 0 and plan.stranded is None
    # The next pass sees the swap done: nothing more to do while "a" stays silent.
    swapped = [running_engine("a", role="standby"), running_engine("s", role="active", node="node-2", created=1)]
    plan = plan_replica(0, swapped, 1, HASH, {}, silent)
    assert (plan.promotion, plan.demote, plan.delete, plan.create_standbys) == (None, [], [], 0)


def test_a_silent_standby_never_takes_over_and_a_silent_surplus_active_is_demoted() -> None:
    active = running_engine("a", role="active", ready=False, ready_since=60)
    silent_standby = running_engine("s1", role="standby", node="node-1", created=1)
    answering = running_engine("s2", role="standby", node="node-2", created=2)
    plan = plan_replica(0, [active, silent_standby, answering], 2, HASH, {}, {"s1": NOW})
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s2"]
    plan = plan_replica(0, [active, silent_standby], 1, HASH, {}, {"s1": NOW})
    assert plan.promotion is None and plan.stranded and "no Ready standby" in plan.stranded
    # Two actives (an operator stopped mid-swap): the silent one goes back to standby, kept.
    two = [running_engine("s", role="active", node="node-2", created=1), running_engine("a", role="active", created=2)]
    plan = plan_replica(0, two, 1, HASH, {}, {"a": NOW})
    assert names(plan.demote) == ["a"] and plan.delete == [] and plan.promotion is None
    # Whichever is older: the answering one stays active.
    plan = plan_replica(0, two, 1, HASH, {}, {"s": NOW})
    assert names(plan.demote) == ["s"] and plan.delete == [] and plan.promotion is None


def test_an_unresponsive_active_without_an_answering_standby_stays_and_says_degraded() -> None:
    plan = plan_replica(0, [running_engine("a", role="active")], 0, HASH, {}, {"a": NOW})
    assert plan.promotion is None and plan.delete == [] and plan.demote == []
    assert plan.stranded is not None and "has answered no readiness request" in plan.stranded


def test_same_node_standby_first_and_never_one_on_other_weights() -> None:
    active = running_engine("a", role="active", ready=False, ready_since=60)
    other_node = running_engine("s1", role="standby", node="node-2", created=1)
    same_node = running_engine("s2", role="standby", node="node-1", created=2)
    stale = running_engine("s0", role="standby", node="node-1", created=0, spec_hash="old")
    plan = plan_replica(0, [active, other_node, same_node, stale], 3, HASH, {})
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s2"]
    plan = plan_replica(0, [active, stale], 1, HASH, {})
    assert plan.promotion is None and plan.stranded and "no Ready standby" in plan.stranded


def test_during_a_generation_change_the_old_generations_standby_takes_over_the_old_active() -> None:
    """The Service still selects the old generation: its standby is the one that can serve."""
    active = running_engine("a", role="active", ready=False, ready_since=60, spec_hash="old")
    old_standby = running_engine("s-old", role="standby", node="node-2", created=1, spec_hash="old")
    new_standby = running_engine("s-new", role="standby", node="node-1", created=2)
    plan = plan_replica(0, [active, old_standby, new_standby], 2, HASH, {})
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s-old"]
    # A failed new-generation active is never replaced by a standby on the old weights.
    new_active = running_engine("a2", role="active", ready=False, ready_since=60)
    plan = plan_replica(0, [new_active, old_standby], 1, HASH, {})
    assert plan.promotion is None and plan.stranded


def test_no_ready_standby_keeps_the_failed_active_and_says_degraded() -> None:
    active = running_engine("a", role="active", ready=False, ready_since=60)
    starting = running_engine("s", role="standby", ready=False, created=50, started=52, ready_since=51)
    plan = plan_replica(0, [active, starting], 1, HASH, {})
    assert plan.promotion is None and plan.delete == [] and plan.create_standbys == 0
    assert plan.stranded is not None and "fails its readiness probe" in plan.stranded
    # The status then says Degraded, with the reason, and the CRD schema takes it.
    cache = make()
    status = aggregate(cache, Observed([], [], 1, stranded=[plan.stranded]), NOW).wire()
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert status["phase"] == "Degraded" and (degraded["status"], degraded["reason"]) == ("True", "NoReadyStandby")
    WeightCacheStatus.model_validate(status)


def test_a_dead_node_hands_over_even_to_a_starting_standby() -> None:
    active = running_engine("a", role="active", ready=True, node="node-1")
    starting = running_engine("s", role="standby", ready=False, node="node-2", created=50, started=52, ready_since=51)
    plan = plan_replica(0, [active, starting], 1, HASH, {"node-1": NOW})
    assert plan.promotion is not None and names([plan.promotion.promoted]) == ["s"]
    assert names([p for p, _ in plan.delete]) == ["a"] and plan.create_standbys == 1
    assert plan.stranded is not None and "not Ready yet" in plan.stranded


def test_an_active_that_never_got_ready_is_demoted_not_deleted() -> None:
    starting = running_engine("a", role="active", ready=False, started=3, ready_since=2)
    plan = plan_replica(0, [starting, running_engine("s", role="standby", created=1)], 1, HASH, {})
    assert plan.promotion is not None and plan.promotion.failure is None
    assert names(plan.demote) == ["a"] and plan.delete == [] and plan.create_standbys == 0


def test_no_active_at_all_promotes_a_standby_or_creates_one() -> None:
    plan = plan_replica(0, [running_engine("s", role="standby")], 1, HASH, {})
    assert plan.promotion is not None and plan.create_standbys == 1 and not plan.create_active
    # The active was deleted and gone before this pass (an operator restart): still a failover.
    assert plan.promotion.failure is not None and plan.promotion.failure.signal == "PodGone"
    assert plan.promotion.failed is None and plan.promotion.failure.since is None
    plan = plan_replica(0, [], 1, HASH, {})
    assert plan.promotion is None and plan.create_active and plan.create_standbys == 1 and plan.stranded is None


def test_restart_after_the_relabel_converges_to_one_active_without_a_second_promotion() -> None:
    """The operator died after promoting ``s`` and before retiring ``a``: two actives. The next
    pass keeps the Ready one, retires the failed one as the failover would have, and promotes
    nobody; a surplus active that has not failed is demoted instead."""
    failed = running_engine("a", role="active", ready=False, ready_since=60)
    failed["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(60)}}
    promoted = running_engine("s", role="active", node="node-2", created=1)
    plan = plan_replica(0, [failed, promoted], 1, HASH, {})
    assert plan.promotion is None and plan.demote == [] and names([p for p, _ in plan.delete]) == ["a"]
    assert plan.create_standbys == 1
    healthy = running_engine("b", role="active", created=2)
    plan = plan_replica(0, [healthy, promoted], 1, HASH, {})
    assert plan.promotion is None and names(plan.demote) == ["b"] and plan.delete == [] and plan.create_standbys == 0
    # Once demoted, the pass after that has nothing left to do.
    healthy["metadata"]["labels"]["weightcache.io/role"] = "standby"
    plan = plan_replica(0, [healthy, promoted], 1, HASH, {})
    assert (plan.promotion, plan.demote, plan.delete, plan.create_standbys) == (None, [], [], 0)


def test_restart_after_the_deletion_only_creates_the_replacement() -> None:
    gone = running_engine("a", role="active", ready=False)
    gone["metadata"]["deletionTimestamp"] = at(90)
    plan = plan_replica(0, [gone, running_engine("s", role="active", node="node-2", created=1)], 1, HASH, {})
    assert plan.promotion is None and plan.delete == [] and plan.demote == [] and plan.create_standbys == 1


def test_surplus_standbys_go_newest_and_not_ready_first() -> None:
    pods = [
        running_engine("a", role="active"),
        running_engine("s1", role="standby", created=1),
        running_engine("s2", role="standby", created=2),
        running_engine("s3", role="standby", ready=False, created=3, started=4, ready_since=3),
    ]
    plan = plan_replica(0, pods, 1, HASH, {})
    assert names([p for p, _ in plan.delete]) == ["s3", "s2"]
