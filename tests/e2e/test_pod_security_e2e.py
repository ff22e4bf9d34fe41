"""A cache in a namespace whose Pod Security level forbids its pods: the API server's PodSecurity
admission (on by default in the e2e kube-apiserver) would refuse every daemon pod, so the
operator creates nothing and says which label forbids what, and the cache becomes Ready once the
namespace allows its pods."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from operator_e2e import apply_sample, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.rest import ApiError, Kube
from testcluster.sample import pods
from weightcache_operator.plan.podsecurity import ENFORCE_LABEL

pytestmark = pytest.mark.e2e


def label(kube: Kube, namespace: str, level: str) -> None:
    kube.patch(f"/api/v1/namespaces/{namespace}", {"metadata": {"labels": {ENFORCE_LABEL: level}}})


def test_a_cache_in_a_baseline_namespace_is_refused_by_name_and_runs_once_the_namespace_allows_it(
    kube: Kube, cluster: ControlPlane, namespace: str, operator: subprocess.Popen, checkpoint: Path
) -> None:
    label(kube, namespace, "baseline")
    # The API server enforces the label: a pod with a hostPath volume is refused.
    hostpath_pod = {
        "metadata": {"name": "hostpath"},
        "spec": {
            "containers": [{"name": "c", "image": "x", "command": ["true"]}],
            "volumes": [{"name": "v", "hostPath": {"path": "/run/weightcache"}}],
        },
    }
    with pytest.raises(ApiError) as refused:
        kube.create(f"/api/v1/namespaces/{namespace}/pods", hostpath_pod)
    assert refused.value.status == 403 and "violates PodSecurity" in str(refused.value.body), refused.value.body

    apply_sample(cluster, namespace)
    status = wait_phase(kube, namespace, operator, "Failed", timeout=60)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "PodSecurityForbids"), degraded
    for needle in (
        f"{ENFORCE_LABEL}=baseline",
        "need the privileged Pod Security level for hostPath volumes",
        f"kubectl label namespace {namespace} {ENFORCE_LABEL}=privileged --overwrite",
    ):
        assert needle in degraded["message"], degraded["message"]
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []

    # The fix the message names; the next resync renders the cache.
    label(kube, namespace, "privileged")
    status = wait_phase(kube, namespace, operator, "Ready", timeout=300)
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Degraded"] != "PodSecurityForbids"
