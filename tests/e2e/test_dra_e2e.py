"""GPU manifests against the real v1.35 API server: ``gpuAccess: dra`` (resource.k8s.io/v1) and
the GPU holder that books a cache's GPUs otherwise.

The e2e cluster has no DRA driver, so nothing could be allocated; what this proves is that the
ResourceClaimTemplate, the daemon DaemonSet claiming from it and an engine pod sharing a daemon's
claim are valid objects the API server accepts (``kubectl create --dry-run=server`` runs the full
validation and admission chain without storing anything), and that the same server refuses a
pod whose container uses a claim the pod does not declare — so the acceptance means something.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from testcluster.controlplane import ControlPlane
from weightcache_operator.observe.validation import parse
from weightcache_operator.render.daemon import daemon_daemonsets
from weightcache_operator.render.dra import claim_template
from weightcache_operator.render.engine import Member, engine_pod
from weightcache_operator.render.gpu_holder import GPUS_MOUNT, gpu_holder_daemonset

pytestmark = pytest.mark.e2e


def cache_for(namespace: str, nodes: int = 1, gpu_access: str = "dra") -> Any:
    body = {
        "apiVersion": "weightcache.io/v1alpha1",
        "kind": "WeightCache",
        "metadata": {"name": "llm", "namespace": namespace, "uid": "0b6f0e7e-8a3c-4f59-9d7d-5c3f3c1d2e10"},
        "spec": {
            "model": {"source": {"hostPath": {"path": "/models/llm"}}},
            "parallelism": {"tensor": 4, "nodes": nodes},
            "daemon": {"image": "weightcache/daemon:0.1.0", "backend": "cuda-vmm"},
            "engine": {
                "gpuAccess": gpu_access,
                "standbysPerReplica": 1,
                "template": {"spec": {"containers": [{"name": "engine", "image": "weightcache/daemon:0.1.0"}]}},
            },
        },
    }
    cache, problems = parse(body)
    assert cache is not None and not problems, problems
    return cache


def dry_run(cluster: ControlPlane, obj: dict[str, Any], check: bool = True) -> Any:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj), check=check)


@pytest.mark.parametrize("nodes", [1, 2])
def test_dra_manifests_are_valid_objects(cluster: ControlPlane, namespace: str, nodes: int) -> None:
    cache = cache_for(namespace, nodes)
    template = json.loads(dry_run(cluster, claim_template(cache)).stdout)
    assert template["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 4 // nodes

    slots = [[f"node-{k + 1}"] for k in range(nodes)]
    for ds in daemon_daemonsets(cache, slots):
        stored = json.loads(dry_run(cluster, ds).stdout)
        pod = stored["spec"]["template"]["spec"]
        assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "llm-gpus"}]
        daemon = next(c for c in pod["containers"] if c["name"] == "daemon")
        assert daemon["resources"]["claims"] == [{"name": "gpus"}]

    member = Member("a1b2c3", 0) if nodes > 1 else None
    engine = engine_pod(cache, 0, "active", ["node-1"], claim="llm-daemon-x2k4p-gpus-9fz7q", member=member)
    if member is None:  # kubectl create needs a name; the operator lets the server generate one
        engine["metadata"]["name"] = engine["metadata"].pop("generateName") + "test"
    stored = json.loads(dry_run(cluster, engine).stdout)
    assert stored["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "llm-daemon-x2k4p-gpus-9fz7q"}]
    assert stored["spec"]["containers"][0]["resources"]["claims"] == [{"name": "gpus"}]

    broken = copy.deepcopy(engine)
    broken["spec"]["containers"][0]["resources"]["claims"] = [{"name": "not-declared"}]
    refused = dry_run(cluster, broken, check=False)
    assert refused.returncode != 0 and "not-declared" in refused.stderr, refused.stderr


def test_gpu_holder_books_the_gpus_and_daemons_request_none(cluster: ControlPlane, namespace: str) -> None:
    """Without dra: the holder DaemonSet requests the GPUs (an extended resource: request = limit)
    and the daemon DaemonSet none, seeing every device and the holder's grant read-only. The same
    server refuses a holder whose GPU request and limit differ, so the acceptance means something."""
    cache = cache_for(namespace, gpu_access="visibleDevices")
    holder = gpu_holder_daemonset(cache, [])
    assert holder is not None
    stored = json.loads(dry_run(cluster, holder).stdout)
    container = stored["spec"]["template"]["spec"]["containers"][0]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == container["resources"]["requests"]["nvidia.com/gpu"]
        == "4"
    )
    assert container["command"][-2:] == ["--expect", "4"]

    [daemonset] = daemon_daemonsets(cache, [])
    pod = json.loads(dry_run(cluster, daemonset).stdout)["spec"]["template"]["spec"]
    daemon = next(c for c in pod["containers"] if c["name"] == "daemon")
    assert "nvidia.com/gpu" not in json.dumps(daemon.get("resources", {}))
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in daemon["env"]
    grant = next(m for m in daemon["volumeMounts"] if m["mountPath"] == GPUS_MOUNT)
    assert grant["readOnly"] is True and "--gpus-file" in daemon["command"]

    broken = copy.deepcopy(holder)
    broken["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "2"
    refused = dry_run(cluster, broken, check=False)
    assert refused.returncode != 0 and "nvidia.com/gpu" in refused.stderr, refused.stderr
