"""Deleting a WeightCache while one of its nodes has stopped answering still completes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from operator_e2e import apply_sample, is_ready
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_deletion_completes_with_a_node_gone(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
) -> None:
    """A node that stops answering never confirms its pods' stop: the finalizer deletes them with
    grace 0 once the node is NotReady, so deleting the WeightCache still completes."""
    apply_sample(cluster, namespace)
    wait_for(
        lambda: (
            sorted(p["spec"].get("nodeName") or "" for p in pods(kube, namespace, DAEMONS) if is_ready(p))
            == ["node-1", "node-2"]
        ),
        120,
        describe=lambda: pods(kube, namespace, DAEMONS),
    )
    kubelet.fail_node("node-2")
    try:
        wait_for(
            lambda: (
                not any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in kube.get("/api/v1/nodes/node-2")["status"]["conditions"]
                )
            ),
            30,
        )
        cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=60s")
        assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    finally:
        kubelet.recover_node("node-2")
        wait_for(
            lambda: any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in kube.get("/api/v1/nodes/node-2")["status"]["conditions"]
            ),
            30,
        )
