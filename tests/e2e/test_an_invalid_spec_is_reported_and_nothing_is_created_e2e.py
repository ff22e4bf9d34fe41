"""A WeightCache whose spec the operator refuses: status says why, nothing is created, and deleting
it completes."""

from __future__ import annotations

import subprocess

import pytest
from operator_e2e import apply_sample, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.rest import Kube
from testcluster.sample import pods

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model__quantization": {"method": "fp8", "weightBlockSize": [64, 64]}}, "verified for [128, 128] only"),
        ({"daemon__resources": {"limits": {"nvidia.com/gpu": 1}}}, "cpu-shm uses no GPUs"),
        (
            {"daemon__backend": "cuda-vmm", "daemon__resources": {"limits": {"nvidia.com/gpu": 1}}},
            "GPUs per node must be ≥ ranks per node",
        ),
    ],
)
def test_invalid_spec_is_reported_and_nothing_is_created(
    cluster: ControlPlane, kube: Kube, namespace: str, operator: subprocess.Popen, changes: dict, message: str
) -> None:
    apply_sample(cluster, namespace, **changes)
    status = wait_phase(kube, namespace, operator, "Failed", timeout=60)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec") and message in degraded["message"]
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
    assert operator.poll() is None
    wc = kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")
    assert wc["metadata"]["finalizers"] == ["weightcache.io/cleanup"]
    # Deleting an invalid object completes: its finalizer has nothing to wait for.
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=30s")
