"""Two operator replicas (kopf peering, by priority): one acts at a time, and the other takes over
once it is gone."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from operator_e2e import apply_sample, stop_operator, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.rest import Kube
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_two_replicas_do_not_fight_and_hand_over(
    cluster: ControlPlane, kube: Kube, namespace: str, start_operator: Callable[..., subprocess.Popen]
) -> None:
    """kopf peering: a higher-priority replica makes the running one pause — which then stops
    acting for its caches, so its own timers and engine probes run no pass (kopf stops the
    per-cache daemon that marks it acting) — and the paused one takes over again (here: the
    deletion and its finalizer) once the higher one is gone."""
    # kopf starts paused and resumes once the peering object shows no higher-priority peer.
    resumed = lambda proc: "Resuming operations" in proc.log.read_text()  # noqa: E731
    log = lambda proc: proc.log.read_text()  # noqa: E731
    # This namespace's cache only: an earlier test's cache of the same name may still be finalizing.
    acting = lambda proc, on: sum(  # noqa: E731
        f'"message": "{"acting" if on else "no longer acting"} for the cache"' in line
        and f'"namespace": "{namespace}"' in line
        for line in log(proc).splitlines()
    )
    first = start_operator(priority=100)
    wait_for(lambda: resumed(first), 30, describe=lambda: log(first)[-3000:])
    apply_sample(cluster, namespace, model__quantization={"method": "fp8", "weightBlockSize": [64, 64]})
    wait_phase(kube, namespace, first, "Failed", timeout=60)
    wait_for(lambda: acting(first, True) == 1, 30, describe=lambda: log(first)[-3000:])

    second = start_operator(priority=200)

    def priorities() -> set[int]:
        peering = json.loads(cluster.kubectl("get", "clusterkopfpeering", "weightcache-operator", "-o", "json").stdout)
        return {p["priority"] for p in (peering.get("status") or {}).values()}

    wait_for(lambda: {100, 200} <= priorities(), 30, describe=priorities)
    wait_for(
        lambda: "Pausing operations" in log(first) and acting(first, False) == 1,
        60,
        describe=lambda: log(first)[-3000:],
    )
    wait_for(lambda: resumed(second) and acting(second, True) == 1, 60, describe=lambda: log(second)[-3000:])
    assert acting(first, True) == 1, "the paused replica does not act again while the other runs"

    stop_operator(second)
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=60s")
    assert first.poll() is None
    assert "Deletion is processed" in log(first), log(first)[-3000:]
