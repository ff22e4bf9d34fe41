"""failures.py: every failure signal of an engine pod classified from the pod as the API server shows
it, and timed from the API's stamps (an unresponsive pod's, from the probe's own clock)."""

from __future__ import annotations

from datetime import timedelta

from builders import NOW, at, node
from replica_plans import running_engine
from weightcache_operator.observe.failures import failure_of, unready_nodes


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
