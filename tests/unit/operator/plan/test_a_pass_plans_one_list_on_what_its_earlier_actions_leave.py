"""pass_plan.py: a pass's plan is one list in ``actions.ORDER``; each planner plans on the view
the actions planned before it leave (``foresee``), and the snapshot itself is left as read — the
executor writes the API's answers into it."""

from __future__ import annotations

import copy
from datetime import timedelta

from builders import BASE, NOW, after, condition, daemon, daemonset, make, node
from replica_plans import HASH, running_engine
from weightcache_operator.objects import PodView
from weightcache_operator.observe.daemon_status import DaemonReport, DaemonStatusReader
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import ApplyDaemonSet, DeleteDaemonSet, Failover, SetGate, in_order
from weightcache_operator.plan.engine_plan import desired
from weightcache_operator.plan.pass_plan import foresee, plan_pass
from weightcache_operator.vocabulary import READY_GATE


def _silent(url: str, timeout_s: float) -> DaemonReport:
    raise OSError(f"{url}: no daemon answers in unit tests")


def _snapshot_with_a_daemon_down() -> Snapshot:
    """An active on node-1, whose daemon is NotReady since NOW, and a Ready standby on node-2."""
    down = daemon(node="node-1", spec_hash=HASH, uid="d1", conditions=[condition("Ready", False, since=0)])
    up = daemon(node="node-2", spec_hash=HASH, uid="d2", ready=True)
    active = running_engine("a", role="active", mapped_from="d1", containers_ready=True)
    standby = running_engine("s", role="standby", node="node-2", created=1, mapped_from="d2")
    return Snapshot(
        body=copy.deepcopy(dict(BASE)),
        cache=make(),
        nodes=[node("node-1", ready=True), node("node-2", ready=True)],
        daemon_pods=[down, up],
        engine_pods=[active, standby],
    )


def test_a_gate_the_pass_turns_false_is_the_failure_its_engine_plan_acts_on_and_the_snapshot_is_left_as_read() -> None:
    snapshot = _snapshot_with_a_daemon_down()
    read = copy.deepcopy(snapshot.engine_pods)
    cache = snapshot.cache
    assert cache is not None

    plan = plan_pass(
        cache,
        snapshot,
        desired(cache),
        after(600),  # ten minutes down: past the 30 s grace
        apply=False,
        grace=timedelta(seconds=30),
        daemon_status=DaemonStatusReader(fetch=_silent),
    )

    assert plan.actions == in_order(plan.actions), "one list, in actions.ORDER"
    gate = next(a for a in plan.actions if isinstance(a, SetGate))
    assert (gate.pod, gate.gate and gate.gate["status"]) == ("a", "False")
    failover = next(a for a in plan.actions if isinstance(a, Failover))
    assert failover.promotion.failure is not None and failover.promotion.failure.signal == "DaemonNotReady"
    assert plan.actions.index(gate) < plan.actions.index(failover)
    assert PodView(plan.view.engine_pods[0]).condition_status(READY_GATE) == "False"
    assert snapshot.engine_pods == read, "the plan folds into a copy; the executor writes the API's answers"


def test_a_planned_daemonset_keeps_the_live_ones_identity_and_counts_under_the_wanted_labels() -> None:
    live = daemonset("tiny-daemon", uid="ds-7", labels={"a": "old", "kept": "yes"}, desired=3)
    live["metadata"]["annotations"] = {"note": "live"}
    wanted = {"metadata": {"name": "tiny-daemon", "labels": {"a": "new"}, "annotations": {"x": "1"}}, "spec": {}}
    view = Snapshot(body=dict(BASE), cache=None, daemonsets=[live, daemonset("tiny-daemon-old", uid="ds-8")])

    foresee(view, [ApplyDaemonSet(wanted, live), DeleteDaemonSet("tiny-daemon-old", "layout changed")], NOW)

    (applied,) = view.daemonsets
    assert applied["metadata"]["uid"] == "ds-7", "its pods' ownerReferences still name it"
    assert applied["metadata"]["labels"] == {"a": "new", "kept": "yes"}
    assert applied["metadata"]["annotations"] == {"note": "live", "x": "1"}
    assert applied["status"]["desiredNumberScheduled"] == 3, "the controller's count until it recounts"
    assert applied["spec"] == {}
