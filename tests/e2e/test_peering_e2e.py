"""Two operator replicas against one cache, the acting one preempted at start-up, SIGKILLed
mid-rollout and restarted mid-rollout: the API server's audit log shows that no two replicas
ever wrote to the cache's objects at once, the survivor took over, and the cache ended Ready.

"At once", precisely: order every write (create, update, patch, delete, any subresource) that
either replica's ServiceAccount sent to an object in the cache's namespace (the WeightCache, its
pods, DaemonSet, Service) by the time the API server received it, and cut that sequence into
tenures, maximal runs by one replica. Two replicas wrote at once if a tenure's first write was
received before the previous tenure's last write was answered, or if there are more tenures than
hand-overs (a replica writing again after the other had started: interleaving)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from operator_e2e import is_ready, sample, wait_phase
from test_rollout_e2e import apply, env_of, rollout, with_engine_env
from testcluster.audit import Write, writes
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import ENGINES, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

TAKEN = "hand-over lease taken"


def version(body: dict, n: int) -> dict:
    return with_engine_env(body, "ENGINE_VERSION", str(n))


def rolled_to(kube: Kube, namespace: str, n: int) -> Callable[[], bool]:
    def done() -> bool:
        engines = pods(kube, namespace, ENGINES)
        return (
            rollout(kube, namespace).get("phase") == "Complete"
            and len(engines) == 2
            and all(env_of(p).get("ENGINE_VERSION") == str(n) and is_ready(p) for p in engines)
        )

    return done


def tenures(found: list[Write]) -> list[list[Write]]:
    """``found`` cut into maximal runs of one writer."""
    runs: list[list[Write]] = []
    for write in found:
        if runs and runs[-1][0].user == write.user:
            runs[-1].append(write)
        else:
            runs.append([write])
    return runs


def test_two_replicas_never_write_to_one_cache_at_once_through_preemption_kill_and_restart(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    checkpoint: Path,
    start_operator: Callable[..., subprocess.Popen],
) -> None:
    high, low = f"system:serviceaccount:{namespace}:replica-high", f"system:serviceaccount:{namespace}:replica-low"
    log = lambda proc: proc.log.read_text()  # noqa: E731
    body = version(sample(), 0)

    # Start-up: the low replica acts alone, then the high one starts while passes are running.
    second = start_operator(priority=100, service_account="replica-low")
    wait_for(lambda: "Resuming operations" in log(second), 60, describe=lambda: log(second)[-3000:])
    apply(cluster, namespace, body)
    wait_for(
        lambda: kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"], 60, describe=lambda: log(second)
    )
    first = start_operator(priority=200, service_account="replica-high")
    acting = f'"message": "acting for the cache", "cache": "tiny-llama", "namespace": "{namespace}"'
    wait_for(lambda: acting in log(first), 90, describe=lambda: log(first)[-3000:] + log(second)[-3000:])
    wait_phase(kube, namespace, first, "Ready")

    # The acting replica dies mid-rollout; the other one finishes it.
    apply(cluster, namespace, version(body, 1))
    wait_for(
        lambda: rollout(kube, namespace).get("phase") == "Progressing", 60, describe=lambda: rollout(kube, namespace)
    )
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    # Taken once the process is reaped: a write it had sent before the kill may reach the API
    # server a few milliseconds after the signal; once it is reaped its connections are closed.
    killed = datetime.now(UTC)
    wait_for(
        rolled_to(kube, namespace, 1),
        300,
        interval=0.5,
        describe=lambda: (rollout(kube, namespace), log(second)[-3000:]),
    )

    # It comes back mid-rollout and takes over from the survivor.
    apply(cluster, namespace, version(body, 2))
    wait_for(
        lambda: rollout(kube, namespace).get("phase") == "Progressing", 60, describe=lambda: rollout(kube, namespace)
    )
    restarted = datetime.now(UTC)
    third = start_operator(priority=200, service_account="replica-high")
    wait_for(
        rolled_to(kube, namespace, 2),
        300,
        interval=0.5,
        describe=lambda: (rollout(kube, namespace), log(third)[-3000:]),
    )
    wait_phase(kube, namespace, third, "Ready")
    time.sleep(2)  # the last pass's writes, into the log

    ours = [
        w
        for w in writes(cluster.state_dir / "logs" / "audit.log")
        if w.namespace == namespace and w.user in (high, low)
    ]
    runs = tenures(ours)
    print(
        "tenures:",
        [(r[0].user.rsplit(":", 1)[1], len(r), r[0].received.isoformat(), r[-1].answered.isoformat()) for r in runs],
    )
    # Low alone, high after preempting it, low after the kill, high after the restart: no interleaving.
    assert [r[0].user for r in runs] == [low, high, low, high], [(r[0].user, len(r)) for r in runs]
    for before, after in zip(runs, runs[1:], strict=False):
        gap = (after[0].received - before[-1].answered).total_seconds()
        print(f"hand-over {before[0].user} -> {after[0].user}: {gap:.3f} s between the last and the first write")
        assert gap > 0, (before[-1], after[0])
    # The survivor wrote only after the kill; the restarted replica only after it started.
    assert runs[1][-1].received < killed < runs[2][0].received
    assert runs[2][-1].received < runs[3][0].received and restarted < runs[3][0].received
    takeover = (runs[2][0].received - killed).total_seconds()
    handback = (runs[3][0].received - restarted).total_seconds()
    print(f"take-over after SIGKILL: {takeover:.1f} s; hand-back after the restart: {handback:.1f} s")
    assert TAKEN in log(third), log(third)[-3000:]
    assert takeover < 2 * 15 + 5, "within the peering lifetime and the lease's duration (15 s each)"
