"""Why daemons and engines are not ready, as the operator tells it: each node's reason in the
DaemonsReady condition (the daemon's own termination message, the GPU holder's, or what the
daemon's report says it waits for), Failed when every node refuses the spec for one reason, and
one Event per new failure message."""

from __future__ import annotations

from typing import Any

from builders import NOW, container_status, engine, pod, terminated
from cache_status import CACHE, cache_daemon, condition
from weightcache_contract.daemon_report import DaemonReport, RankReport
from weightcache_operator.plan.reasons import MAX_REASON, Reason, exit_reason, failure_events, one_line
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.spec import WeightCacheStatus

HEADS = "num_attention_heads=8 is not divisible by tensor-parallel size 3; use a tp size that divides 8"


def exited(
    pod: dict[str, Any], code: int, message: str | None, *, container: str = "daemon", running_again: bool = True
) -> dict[str, Any]:
    """``pod`` whose ``container`` exited with ``code`` (and ``message``): restarted and running
    again (the exit in lastState), or still terminated."""
    ended = terminated(code, message)
    status = container_status(container, restarts=1, **({"last_exit": ended} if running_again else {"exited": ended}))
    pod["status"]["containerStatuses"] = [status]
    return pod


def test_a_spec_every_node_refuses_for_one_reason_is_failed_with_the_daemons_words() -> None:
    pods = [
        exited(cache_daemon(node="node-1"), 2, HEADS),
        exited(cache_daemon(node="node-2"), 2, HEADS, running_again=False),
    ]
    status = aggregate(CACHE, Observed(pods, [], 2), NOW).wire()
    WeightCacheStatus.model_validate(status)
    assert status["phase"] == "Failed"
    ready = condition(status, "DaemonsReady")
    assert (ready["status"], ready["reason"]) == ("False", "Refused")
    assert ready["message"] == f"0/2 nodes ready; node-1, node-2: daemon exited with code 2: {HEADS}"
    degraded = condition(status, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "Refused")
    assert (
        status["message"] == degraded["message"] == f"every node refuses this spec: daemon exited with code 2: {HEADS}"
    )


def test_nodes_refusing_for_different_reasons_say_each_reason_and_are_not_failed() -> None:
    missing = "/weightcache/model has no config.json: mount the checkpoint directory"
    pods = [exited(cache_daemon(node="node-1"), 2, HEADS), exited(cache_daemon(node="node-2"), 2, missing)]
    status = aggregate(CACHE, Observed(pods, [], 2), NOW).wire()
    assert status["phase"] == "Loading", "different reasons may be the nodes, not the spec"
    ready = condition(status, "DaemonsReady")
    assert ready["reason"] == "DaemonsFailing"
    assert ready["message"] == (
        f"0/2 nodes ready; node-1: daemon exited with code 2: {HEADS}; node-2: daemon exited with code 2: {missing}"
    )


def test_a_node_that_has_not_refused_yet_keeps_the_cache_from_failing() -> None:
    pods = [exited(cache_daemon(node="node-1"), 2, HEADS), cache_daemon(node="node-2")]
    status = aggregate(CACHE, Observed(pods, [], 2), NOW).wire()
    assert status["phase"] == "Loading" and condition(status, "DaemonsReady")["reason"] == "DaemonsFailing"
    assert "node-2" not in condition(status, "DaemonsReady")["message"], "node-2 has said nothing"


def test_a_refused_spec_under_serving_engines_is_degraded_not_failed() -> None:
    pods = [exited(cache_daemon(node="node-1"), 2, HEADS)]
    serving = [engine("tiny-0-a", role="active", ready=True), engine("tiny-0-b", role="standby", ready=True)]
    status = aggregate(CACHE, Observed(pods, serving, 1), NOW).wire()
    assert status["phase"] == "Degraded"
    assert condition(status, "Degraded")["message"].endswith("the previous generation's engines still serve")


def test_a_crash_loop_names_what_the_crashed_daemon_said() -> None:
    looping = exited(cache_daemon(node="node-1"), 2, HEADS)
    looping["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
    status = aggregate(CACHE, Observed([looping, cache_daemon(node="node-2")], [], 2), NOW).wire()
    assert status["phase"] == "Degraded"
    assert condition(status, "Degraded")["message"] == (
        f"crash-looping containers: tiny-daemon-node-1/daemon; node-1: daemon exited with code 2: {HEADS}"
    )


def test_a_crashed_gpu_holder_is_its_nodes_reason() -> None:
    nvml = (
        "the GPU holder reads its GPUs through NVML, which failed (libnvidia-ml.so.1: cannot open shared object file)"
    )
    holders = [
        exited(pod(f"tiny-gpus-{n}", node=n, ready=False), 2, nvml, container="gpu-holder")
        for n in ("node-1", "node-2")
    ]
    waiting = DaemonReport(
        cache="tiny",
        ready=False,
        ranks=[RankReport(rank=0, ready=False, problem="rank 0: waiting for the GPU holder's grant")],
    )
    pods = [cache_daemon(node="node-1"), cache_daemon(node="node-2")]
    reports: dict[str, DaemonReport | str] = {p["metadata"]["name"]: waiting for p in pods}
    status = aggregate(CACHE, Observed(pods, [], 2, daemon_reports=reports, holder_pods=holders), NOW).wire()
    assert status["phase"] == "Failed"
    assert (
        condition(status, "DaemonsReady")["message"]
        == f"0/2 nodes ready; node-1, node-2: gpu-holder exited with code 2: {nvml}"
    )


def test_a_waiting_daemon_says_why_in_daemons_ready_and_the_message_column() -> None:
    said = "rank 0: waiting for the GPU holder's grant before touching any GPU: no GPU holder runs (nobody holds /x/gpus.lock)"
    report = DaemonReport(
        cache="tiny",
        ready=False,
        ranks=[
            RankReport(rank=0, ready=False, problem=said),
            RankReport(rank=1, ready=False, problem=said.replace("rank 0", "rank 1")),
        ],
    )
    status = aggregate(
        CACHE, Observed([cache_daemon(node="node-1")], [], 1, daemon_reports={"tiny-daemon-node-1": report}), NOW
    ).wire()
    assert status["phase"] == "Loading", "waiting may end: not a refusal"
    ready = condition(status, "DaemonsReady")
    assert (ready["reason"], ready["message"]) == (
        "Loading",
        f"0/1 nodes ready; node-1: {said} (and 1 more rank not ready)",
    )
    assert status["message"] == f"node-1: {said} (and 1 more rank not ready)"
    assert condition(status, "Degraded")["status"] == "False"


def test_a_ready_node_keeps_no_reason_from_an_earlier_crash() -> None:
    recovered = exited(cache_daemon(node="node-1", ready=True), 2, HEADS)
    status = aggregate(CACHE, Observed([recovered], [], 1), NOW).wire()
    assert condition(status, "DaemonsReady")["message"] == "1/1 nodes hold every local rank"
    assert status["message"] is None


def test_an_old_generations_crash_is_not_this_specs_reason() -> None:
    old = exited(cache_daemon(node="node-1", spec_hash="old"), 2, HEADS)
    status = aggregate(CACHE, Observed([old], [], 1), NOW).wire()
    assert status["phase"] == "Loading" and condition(status, "DaemonsReady")["message"] == "0/1 nodes ready"


def test_failed_engines_say_why_in_engines_ready() -> None:
    broken = exited(
        engine("tiny-0-a", role="active", ready=False),
        1,
        "Traceback (most recent call last):\n  ...\nValueError: bad port",
        container="engine",
    )
    status = aggregate(CACHE, Observed([cache_daemon(node="node-1", ready=True)], [broken], 1), NOW).wire()
    ready = condition(status, "EnginesReady")
    assert ready["reason"] == "EnginesFailing"
    assert ready["message"].endswith("; tiny-0-a: engine exited with code 1: ValueError: bad port")


def test_a_killed_daemon_is_a_reason_but_not_a_refusal() -> None:
    """Only exit code 2 (the CLI's input, configuration or environment error) refuses the spec:
    a single node's daemon killed while the engines ride it out must not make the cache Failed."""
    killed = exited(cache_daemon(node="node-1"), 137, "ts=… msg=loading")
    status = aggregate(CACHE, Observed([killed], [], 1), NOW).wire()
    assert status["phase"] == "Loading"
    assert condition(status, "DaemonsReady")["reason"] == "DaemonsFailing"
    assert (
        condition(status, "DaemonsReady")["message"]
        == "0/1 nodes ready; node-1: daemon exited with code 137: ts=… msg=loading"
    )


def test_an_exit_without_a_message_says_how_it_ended_and_a_clean_exit_is_no_reason() -> None:
    assert exit_reason(exited(cache_daemon(node="n"), 137, None)) == Reason(
        "daemon exited with code 137 (Error)", refusal=False
    )
    assert exit_reason(exited(cache_daemon(node="n"), 0, "bye")) is None
    assert one_line("x" * 2000) == "x" * (MAX_REASON - 1) + "…"


def test_an_event_is_posted_once_per_new_failure_message() -> None:
    pods = [exited(cache_daemon(node="node-1"), 2, HEADS), exited(cache_daemon(node="node-2"), 2, HEADS)]
    loading = aggregate(CACHE, Observed([cache_daemon(node="node-1"), cache_daemon(node="node-2")], [], 2), NOW)
    failed = aggregate(CACHE, Observed(pods, [], 2), NOW, loading.conditions)
    events = failure_events(loading.conditions, failed.conditions)
    assert events == [("Refused", f"0/2 nodes ready; node-1, node-2: daemon exited with code 2: {HEADS}")]
    again = aggregate(CACHE, Observed(pods, [], 2), NOW, failed.conditions)
    assert failure_events(failed.conditions, again.conditions) == [], "the same message is not posted twice"
    assert failure_events([], loading.conditions) == [], "loading is no failure"
