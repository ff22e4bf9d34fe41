"""A node's entry in the status (plan/status.py) from its daemon's report: each rank's facts, ready
only where both the pod and the daemon say so, the node's fingerprint once every rank has one, and
a report that could not be read as its message."""

from __future__ import annotations

from builders import NOW, daemon, make
from daemon_reports import rank, report
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import SPEC_HASH_ANNOTATION, daemon_spec_hash
from weightcache_operator.spec import WeightCacheStatus


def test_ranks_carry_what_the_daemon_reported_and_the_node_its_fingerprint() -> None:
    cache = make()
    daemon_pod = daemon("tiny-daemon-x", ready=True, spec_hash=daemon_spec_hash(cache))
    held = report(rank(0, gpu_uuid="GPU-a"), rank(1, source="keeper", disk_bytes_read=0))
    status = aggregate(cache, Observed([daemon_pod], [], 1, daemon_reports={"tiny-daemon-x": held}), NOW).wire()
    node = status["nodes"][0]
    assert node["fingerprint"] == held.fingerprint and "reportError" not in node
    assert node["ranks"] == [
        {
            "rank": 0,
            "ready": True,
            "bytes": 4096,
            "loadSeconds": 0.5,
            "gpuUuid": "GPU-a",
            "source": "disk",
            "diskBytesRead": 4000,
        },
        {"rank": 1, "ready": True, "bytes": 8192, "loadSeconds": 1.5, "source": "keeper", "diskBytesRead": 0},
    ]
    WeightCacheStatus.model_validate(status)  # what the CRD schema (generated from it) accepts


def test_a_rank_is_ready_only_if_both_the_pod_and_the_daemon_say_so() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    partly = report(rank(0), rank(1, ready=False))
    status = aggregate(
        cache, Observed([daemon("d", ready=True, annotations=good)], [], 1, daemon_reports={"d": partly}), NOW
    ).wire()
    assert [(r["rank"], r["ready"]) for r in status["nodes"][0]["ranks"]] == [(0, True), (1, False)]
    assert "fingerprint" not in status["nodes"][0], "no node fingerprint until every rank reports one"
    unready = aggregate(
        cache,
        Observed([daemon("d", ready=False, annotations=good)], [], 1, daemon_reports={"d": report(rank(0), rank(1))}),
        NOW,
    ).wire()
    assert [r["ready"] for r in unready["nodes"][0]["ranks"]] == [False, False]
    assert unready["nodes"][0]["ranks"][0]["bytes"] == 4096, "facts stay visible while the pod is not Ready"


def test_an_unreadable_daemon_is_reported_not_raised() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    seen = Observed(
        [daemon("d", ready=True, annotations=good)], [], 1, daemon_reports={"d": "GET http://x/status: refused"}
    )
    node = aggregate(cache, seen, NOW).wire()["nodes"][0]
    assert node["reportError"] == "GET http://x/status: refused"
    assert node["ranks"] == [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}]
