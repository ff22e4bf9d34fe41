"""status.aggregate: the phase, the counts and the conditions of a cache from the pods as they are, a
condition's transition time kept until it changes, and engines that are going or not ready left uncounted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from builders import NOW, container_status, daemon, engine, make
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import (
    SPEC_HASH_ANNOTATION,
    daemon_spec_hash,
)
from weightcache_operator.spec import WeightCacheStatus


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_ready_loading_and_transition_times() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    daemon_pod = daemon("tiny-daemon-x", ready=True, annotations=good)
    seen = Observed(
        [daemon_pod],
        [engine("tiny-0-a", role="active", ready=True), engine("tiny-0-b", role="standby", ready=True)],
        1,
    )
    status = aggregate(cache, seen, NOW).wire()
    assert status["phase"] == "Ready" and status["readyNodes"] == "1/1"
    assert (status["activeEngines"], status["standbyEngines"]) == (1, 1)
    assert status["engines"] == [{"replica": 0, "active": "tiny-0-a", "standbys": ["tiny-0-b"]}]
    assert status["nodes"][0]["ranks"] == [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}]
    assert status["model"] == "hostPath:/models/tiny@r1" and status["observedGeneration"] == 3
    assert conditions(status) == {
        "DaemonsReady": ("True", "AllNodesReady"),
        "EnginesReady": ("True", "AllEnginesReady"),
        "Available": ("True", "ActiveEnginesReady"),
        "Progressing": ("False", "Converged"),
        "Degraded": ("False", "Healthy"),
        "CheckpointChanged": ("False", "Unchanged"),
    }

    # A daemon of an older spec does not count, and the DaemonsReady transition is stamped now.
    later = datetime(2026, 11, 29, 10, 5, tzinfo=UTC)
    stale = daemon("tiny-daemon-x", ready=True, spec_hash="old")
    previous = WeightCacheStatus.model_validate(status).conditions
    status2 = aggregate(cache, Observed([stale], seen.engine_pods, 1), later, previous).wire()
    by_type = {c["type"]: c for c in status2["conditions"]}
    # The engines still serve, so the phase stays Ready; DaemonsReady says what is missing.
    assert status2["phase"] == "Ready" and status2["readyNodes"] == "0/1"
    assert by_type["DaemonsReady"]["status"] == "False"
    assert by_type["DaemonsReady"]["lastTransitionTime"] == "2026-11-29T10:05:00Z"
    assert by_type["Available"]["lastTransitionTime"] == "2026-11-29T10:00:00Z", "unchanged status keeps its time"


def test_status_pending_degraded_and_invalid() -> None:
    cache = make()
    assert aggregate(cache, Observed([], [], 0), NOW).wire()["phase"] == "Pending"
    looping = daemon("tiny-daemon-x", ready=False, containers=[container_status("main", waiting="CrashLoopBackOff")])
    status = aggregate(cache, Observed([looping], [], 1), NOW).wire()
    assert status["phase"] == "Degraded" and conditions(status)["Degraded"] == ("True", "CrashLoop")
    invalid = aggregate(cache, Observed(problems=["spec.model.quantization.weightBlockSize [64, 64] ..."]), NOW).wire()
    assert invalid["phase"] == "Failed"
    degraded = next(c for c in invalid["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec" and "[64, 64]" in degraded["message"]


def test_terminating_or_unready_engines_are_not_counted() -> None:
    cache = make(**{"engine.replicas": 2})
    going = engine("tiny-0-a", role="active", ready=True)
    going["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    seen = Observed(
        [],
        [
            going,
            engine("tiny-1-a", replica=1, role="active", ready=False),
            engine("tiny-1-b", replica=1, role="standby", ready=True),
        ],
        1,
    )
    status = aggregate(cache, seen, NOW).wire()
    assert (status["activeEngines"], status["standbyEngines"]) == (0, 1)
    assert status["engines"][0] == {"replica": 0, "active": None, "standbys": []}
    assert conditions(status)["Available"] == ("False", "NoActiveEngine")
