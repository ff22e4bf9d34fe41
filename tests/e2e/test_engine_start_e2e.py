"""Engine starts as the operator records them, on the real control plane: the README sample with
``engine.rollout.readyDeadlineSeconds: 2`` (so a start is slow from 1 s and every engine start here
is one) turns Available; ``status.lastEngineStart`` shows the latest engine's start by phase, a
``SlowEngineStart`` Warning names it, and the operator's /metrics has
``weightcache_operator_engine_start_seconds`` for each phase, observed once per engine pod."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from operator_e2e import apply_sample, http_text, metric, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.rest import Kube
from testcluster.sample import ENGINES, NAME, events, pods

pytestmark = pytest.mark.e2e


def test_engine_starts_reach_status_an_event_and_the_histogram(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> None:
    apply_sample(cluster, namespace, engine__rollout={"readyDeadlineSeconds": 2})
    status = wait_phase(
        kube, namespace, operator, "Ready", also=lambda s: s["activeEngines"] == 1 and s["standbyEngines"] == 1
    )
    engines = {p["metadata"]["name"]: p for p in pods(kube, namespace, ENGINES)}
    assert len(engines) == 2, sorted(engines)

    start = status["lastEngineStart"]
    print(f"lastEngineStart: {start}")
    assert start["pod"] in engines and start["node"] == engines[start["pod"]]["spec"]["nodeName"]
    assert 0 <= start["scheduledSeconds"] <= start["startedSeconds"] <= start["readySeconds"], start
    # The reference engine imports torch and binds its weights after its container started: the
    # API's whole-second stamps cannot put Ready before that start.
    assert start["readySeconds"] >= 1 and start["slow"] is True and start["restarts"] == 0, start
    assert start["createdAt"] == engines[start["pod"]]["metadata"]["creationTimestamp"]

    slow = events(kube, namespace, "SlowEngineStart", at_least=2)
    told = {pod for pod in engines if any(pod in e["message"] for e in slow)}
    assert told == set(engines), [e["message"] for e in slow]
    assert all(e["type"] == "Warning" and "readyDeadlineSeconds (2s)" in e["message"] for e in slow), slow

    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    mine = {"namespace": namespace, "cache": NAME}
    for phase in ("scheduled", "started", "ready"):
        count = metric(scraped, "weightcache_operator_engine_start_seconds_count", **mine, phase=phase)
        assert count == 2, f"{phase}: one observation per engine pod, not per pass: {count}"
    total = metric(scraped, "weightcache_operator_engine_start_seconds_sum", **mine, phase="ready")
    assert total >= start["readySeconds"], (total, start)
