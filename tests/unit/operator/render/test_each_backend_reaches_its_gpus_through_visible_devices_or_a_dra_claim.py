"""How daemons and engines reach GPUs for each backend: through the GPU holder and visible devices, or
through one DRA claim the daemon makes from a template and its engines share while it is current."""

from __future__ import annotations

import copy

import pytest
from builders import BASE, daemon, make
from rendered import container, env_of
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import (
    daemon_daemonset,
    engine_pod,
)
from weightcache_operator.render.dra import claim_template, daemon_claim, engine_claim_current
from weightcache_operator.render.gpu_holder import gpu_holder_daemonset, reads_grant


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc", "cpu-shm"])
@pytest.mark.parametrize("access", ["visibleDevices", "dra"])
def test_gpu_access_modes_for_each_backend(backend: str, access: str) -> None:
    """visibleDevices: the daemon requests nvidia.com/gpu and engines see every device; dra: the
    daemon claims devices from a template and engines share that very claim; cpu-shm: no GPUs."""
    body = copy.deepcopy(BASE)
    body["spec"]["daemon"]["backend"] = backend
    body["spec"]["engine"]["gpuAccess"] = access
    cache, problems = parse(body)
    if backend == "cpu-shm" and access == "dra":
        assert cache is None and any("needs a GPU daemon backend" in p for p in problems), problems
        return
    assert cache is not None and not problems, problems
    ds = daemon_daemonset(cache)
    pod_spec = ds["spec"]["template"]["spec"]
    daemon = container(ds, "daemon")
    claim = "tiny-daemon-abcde-gpus-x7"
    engine = engine_pod(cache, 0, "active", ["node-1"], claim=claim if access == "dra" else None)
    main = container(engine, "engine")
    if access == "dra":
        template = claim_template(cache)
        assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
        assert (
            template["metadata"]["name"] == "tiny-gpus" and template["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        )
        assert template["spec"]["spec"]["devices"]["requests"] == [
            {
                "name": "gpus",
                "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
            }
        ]
        assert pod_spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "tiny-gpus"}]
        assert daemon["resources"] == {"claims": [{"name": "gpus"}]}, "no nvidia.com/gpu next to a claim"
        assert "resources" not in container(ds, "keeper") if backend == "cuda-vmm" else True
        assert engine["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": claim}]
        assert main["resources"] == {"claims": [{"name": "gpus"}]}
        assert engine["metadata"]["annotations"]["weightcache.io/resource-claim"] == claim
        assert "NVIDIA_VISIBLE_DEVICES" not in env_of(main), "the claim's devices are the engine's devices"
        with pytest.raises(ValueError, match="ResourceClaim"):
            engine_pod(cache, 0, "active")
    else:
        assert "resourceClaims" not in pod_spec and "resourceClaims" not in engine["spec"]
        assert "resources" not in main and "weightcache.io/resource-claim" not in engine["metadata"]["annotations"]
        assert "resources" not in daemon, "the GPU holder requests the GPUs"
        holder = gpu_holder_daemonset(cache, [])
        gpus = None if holder is None else container(holder, "gpu-holder")["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == (None if backend == "cpu-shm" else "2")
        assert ("NVIDIA_VISIBLE_DEVICES" in env_of(main)) is (backend != "cpu-shm")
        assert env_of(daemon).get("NVIDIA_VISIBLE_DEVICES") == (None if backend == "cpu-shm" else "all")
    if access == "dra":
        assert gpu_holder_daemonset(cache, []) is None and not reads_grant(ds), "the claim books the GPUs"
        assert "--gpus-file" not in daemon["command"]


def test_dra_device_class_and_claim_currency() -> None:
    cache = make(
        **{
            "daemon.backend": "cuda-vmm",
            "engine.gpuAccess": "dra",
            "engine.dra": {"deviceClassName": "h200.gpu.example.com"},
            "parallelism.tensor": 4,
        }
    )
    request = claim_template(cache)["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "h200.gpu.example.com" and request["exactly"]["count"] == 4
    claimed = daemon(claim="c-1")
    assert daemon_claim(claimed) == "c-1" and daemon_claim(daemon()) is None
    engine = engine_pod(cache, 0, "active", ["n"], claim="c-1")
    assert engine_claim_current(engine, claimed)
    assert not engine_claim_current(engine_pod(cache, 0, "active", ["n"], claim="c-0"), claimed), "replaced daemon"
    assert not engine_claim_current(engine, None)
    assert engine_claim_current(engine_pod(make(), 0, "active"), None), "visibleDevices depends on no claim"
    body = copy.deepcopy(BASE)
    body["spec"]["engine"]["dra"] = {"deviceClassName": "Not_A_Name"}
    assert parse(body)[0] is None
