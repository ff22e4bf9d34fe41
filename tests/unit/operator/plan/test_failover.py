"""failover.py: every failure signal classified from pods as the API server shows them, and the
per-replica plan, including states an operator killed mid-failover leaves behind."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from itertools import count
from typing import Any

import pytest
from builders import NOW, at, daemon, engine, make, node
from weightcache_operator.act.metrics import OperatorMetrics
from weightcache_operator.objects import PodView
from weightcache_operator.observe.failures import failure_of, unready_nodes
from weightcache_operator.plan.actions import Action, Create, Delete, Failover, Promotion, SetRole
from weightcache_operator.plan.engine_units import Unit, units
from weightcache_operator.plan.engine_writes import EngineWrites
from weightcache_operator.plan.failover import failover_status
from weightcache_operator.plan.failover import plan_replica as plan_of_replica
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.spec import WeightCacheStatus

HASH = "h1"

running_engine = partial(
    engine, spec_hash=HASH, gate="True", phase="Running", created=0, started=1, ready=True, ready_since=5
)
"""An engine pod of replica 0 on node-1 as the API shows it: created at NOW, its container running
since NOW+1, Ready and its daemon-ready gate True since NOW+5."""


def names(pods: list[Any]) -> list[str]:
    return [p if isinstance(p, str) else p.name if isinstance(p, Unit) else p["metadata"]["name"] for p in pods]


DAEMONS = {0: {n: daemon(node=n, spec_hash=HASH) for n in ("node-1", "node-2", "node-9")}}
"""Ready daemons where new engines may go: node-9 runs no engine in these tests, so a creation
is never refused for want of a node (a cordon of node-1 included)."""


@dataclass
class Planned:
    """What ``failover.plan_replica`` wrote for one replica, read back from its actions."""

    actions: list[Action]
    stranded: str | None

    @property
    def promotion(self) -> Promotion | None:
        return next((a.promotion for a in self.actions if isinstance(a, Failover)), None)

    @property
    def demote(self) -> list[str]:
        return [a.name for a in self.actions if isinstance(a, SetRole) and a.role == "standby"]

    @property
    def delete(self) -> list[tuple[str, str]]:
        return [(a.name, a.why) for a in self.actions if isinstance(a, Delete)]

    def created(self, role: str) -> int:
        return sum(1 for a in self.actions if isinstance(a, Create) and PodView(a.pod).role == role)

    @property
    def create_active(self) -> bool:
        return self.created("active") > 0

    @property
    def create_standbys(self) -> int:
        return self.created("standby")


def plan_units(replica: int, found: list[Unit], *args: Any) -> Planned:
    """``plan_replica`` with ``plan_replica``'s positional arguments after the units, its actions
    written through an ``EngineWrites`` that can place new engines (``DAEMONS``)."""
    cordoned = args[5] if len(args) > 5 else frozenset()
    ids = count()
    writes = EngineWrites(make(), found, DAEMONS, lambda: f"g{next(ids)}", cordoned)
    return Planned(writes.actions, plan_of_replica(replica, found, *args, writes=writes))


def plan_replica(replica: int, pods: list[dict[str, Any]], *args: Any) -> Planned:
    """The plan for single-pod engines: each pod a unit of one."""
    return plan_units(replica, units(pods, 1), *args)


# --- signals -------------------------------------------------------------------------------------


def test_a_ready_pod_and_a_pod_that_was_never_ready_have_no_failure() -> None:
    assert failure_of(running_engine("a", role="active"), {}) is None
    # Ready False since before its container started: starting, not failed.
    assert failure_of(running_engine("a", role="active", ready=False, started=3, ready_since=2), {}) is None


def test_deletion_is_timed_from_the_request_not_the_end_of_the_grace_period() -> None:
    deleted = running_engine("a", role="active")
    deleted["metadata"] |= {"deletionTimestamp": at(40), "deletionGracePeriodSeconds": 30}
    failure = failure_of(deleted, {})
    assert failure is not None and failure.signal == "PodDeleted" and failure.final
    assert failure.since == NOW + timedelta(seconds=10)


def test_eviction_and_a_failed_pod_are_final() -> None:
    evicted = running_engine(
        "a", role="active", phase="Failed", status={"reason": "Evicted", "message": "node low on memory"}
    )
    failure = failure_of(evicted, {})
    assert (
        failure is not None
        and (failure.signal, failure.final) == ("PodEvicted", True)
        and "low on memory" in failure.detail
    )
    failed = running_engine("a", role="active", phase="Failed")
    failed["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 1, "finishedAt": at(7)}}
    failure = failure_of(failed, {})
    assert failure is not None and failure.signal == "PodFailed" and failure.since == NOW + timedelta(seconds=7)


def test_a_not_ready_node_fails_even_a_pod_that_still_shows_ready() -> None:
    nodes = [node("node-1", ready="Unknown", ready_since=9), node("node-2", ready=True)]
    unready = unready_nodes(nodes)
    assert unready == {"node-1": NOW + timedelta(seconds=9)}
    failure = failure_of(running_engine("a", role="active", ready=True), unready)
    assert failure is not None and (failure.signal, failure.final, failure.since) == (
        "NodeNotReady",
        True,
        NOW + timedelta(seconds=9),
    )
    assert failure_of(running_engine("b", role="active", node="node-2"), unready) is None


def test_a_restarted_container_is_timed_from_its_finish() -> None:
    restarted = running_engine("a", role="active", ready=False, started=21, ready_since=20)
    restarted["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 137, "finishedAt": at(20)}}
    failure = failure_of(restarted, {})
    assert (
        failure is not None and failure.signal == "ContainerRestarted" and failure.since == NOW + timedelta(seconds=20)
    )
    assert not failure.final
    crashing = running_engine("a", role="active", ready=False)
    crashing["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    crashing["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(30)}}
    failure = failure_of(crashing, {})
    assert (
        failure is not None and failure.signal == "ContainerRestarted" and failure.since == NOW + timedelta(seconds=30)
    )


def test_an_old_restart_does_not_explain_a_new_readiness_failure() -> None:
    frozen = running_engine("a", role="active", ready=False, started=11, ready_since=100)
    frozen["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(10)}}
    failure = failure_of(frozen, {})
    assert failure is not None and failure.signal == "ReadinessFailed" and failure.since == NOW + timedelta(seconds=100)


def test_a_false_gate_names_the_daemon() -> None:
    gated = running_engine("a", role="active", ready=False, gate="False", ready_since=50)
    failure = failure_of(gated, {})
    assert failure is not None and failure.signal == "DaemonNotReady" and "daemon on node-1" in failure.detail
    # The operator turns the gate False before the kubelet recomputes Ready: already a failure.
    failure = failure_of(running_engine("a", role="active", ready=True, gate="False"), {})
    assert failure is not None and failure.signal == "DaemonNotReady"


def test_a_silent_pod_the_kubelet_still_calls_ready_is_unresponsive_and_kept() -> None:
    silent = {"a": NOW + timedelta(seconds=70, milliseconds=250)}
    failure = failure_of(running_engine("a", role="active"), {}, silent)
    assert failure is not None and failure.signal == "Unresponsive" and failure.seen == silent["a"]
    assert failure.since is None, "the API has no timestamp for it: the probe's own clock is the operator's"
    assert "10:01:10.250" in failure.detail and not failure.final and not failure.retire
    # Once the kubelet has its own verdict, its signal is the one recorded.
    failure = failure_of(running_engine("a", role="active", ready=False, ready_since=80), {}, silent)
    assert failure is not None and failure.signal == "ReadinessFailed" and failure.retire
    assert failure_of(running_engine("b", role="active"), {}, silent) is None


# --- plans ---------------------------------------------------------------------------------------


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


def test_last_failover_entry_and_metrics() -> None:
    active = running_engine("a", role="active", ready=False, ready_since=60)
    active["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(60)}}
    plan = plan_replica(0, [active, running_engine("s", role="standby", node="node-2", created=1)], 1, HASH, {})
    assert plan.promotion is not None
    noticed = NOW + timedelta(seconds=60, milliseconds=250)
    seen = noticed - timedelta(milliseconds=3)
    entry = failover_status(plan.promotion, noticed, noticed + timedelta(milliseconds=12), seen).wire()
    assert entry == {
        "time": "2026-11-29T10:01:00.250000Z",
        "replica": 0,
        "from": "a",
        "fromNode": "node-1",
        "to": "s",
        "toNode": "node-2",
        "signal": "ContainerRestarted",
        "reason": "container engine of a restarted",
        "detectionMs": 3.0,
        "promotionMs": 12.0,
        "failureApiSecond": "2026-11-29T10:01:00Z",
    }
    parsed = WeightCacheStatus.model_validate({"lastFailover": entry})
    assert parsed.last_failover is not None and parsed.last_failover.from_ == "a"

    metrics = OperatorMetrics()
    metrics.failover("ns", "tiny", "ContainerRestarted", entry["detectionMs"], entry["promotionMs"])
    text = metrics.render()
    assert 'weightcache_operator_failovers_total{cache="tiny",namespace="ns",signal="ContainerRestarted"} 1' in text
    assert 'weightcache_operator_failover_promotion_seconds_bucket{cache="tiny",namespace="ns",le="0.01"} 0' in text
    assert 'weightcache_operator_failover_promotion_seconds_bucket{cache="tiny",namespace="ns",le="0.025"} 1' in text
    assert (
        'weightcache_operator_failover_detection_seconds_count{cache="tiny",namespace="ns",signal="ContainerRestarted"} 1'
        in text
    )


def test_a_promotion_without_a_failed_pod_has_no_from() -> None:
    promotion = Promotion(2, running_engine("s", role="standby"), None, None)
    entry = failover_status(promotion, NOW, NOW, None).wire()
    assert "from" not in entry and "signal" not in entry and entry["to"] == "s" and entry["promotionMs"] == 0.0
