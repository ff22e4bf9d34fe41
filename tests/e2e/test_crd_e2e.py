"""The generated WeightCache CRD against the real API server: the schema is accepted as
structural, valid objects are stored with the same defaults the pydantic models apply, and
invalid ones are refused with messages that name the field and say what to fix."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from testcluster.controlplane import ControlPlane
from testcluster.rest import MERGE, ApiError, Kube
from weightcache_operator.spec import API_VERSION, PLURAL, WeightCache

pytestmark = pytest.mark.e2e

SAMPLE_PATH = Path(__file__).resolve().parents[2] / "examples" / "weightcache-cpu.yaml"


def sample(name: str = "sample") -> dict[str, Any]:
    obj = yaml.safe_load(SAMPLE_PATH.read_text())
    obj["metadata"]["name"] = name
    return obj


def collection(namespace: str) -> str:
    return f"/apis/{API_VERSION}/namespaces/{namespace}/{PLURAL}"


def test_sample_is_stored_with_the_models_defaults(
    cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str
) -> None:
    cluster.apply(SAMPLE_PATH.read_text(), namespace=namespace)
    stored = kube.get(f"{collection(namespace)}/tiny-llama")
    # The API server's defaulting and the models' defaulting agree, field for field.
    parsed = WeightCache.model_validate(stored)
    assert stored["spec"] == parsed.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert stored["spec"]["engine"]["gpuAccess"] == "visibleDevices"
    assert stored["spec"]["model"]["quantization"] == {"method": "none", "weightBlockSize": [128, 128]}
    assert stored["spec"]["parallelism"] == {"tensor": 2, "pipeline": 1, "nodes": 1, "expert": 1}


def test_gpu_sample_is_accepted_as_written(
    cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str
) -> None:
    """The README's GPU variant passes the API server's schema and CEL rules, and its stored
    form parses back into the same model (the e2e cluster has no GPUs to run it on)."""
    path = SAMPLE_PATH.with_name("weightcache-gpu.yaml")
    cluster.apply(path.read_text(), namespace=namespace)
    stored = kube.get(f"{collection(namespace)}/qwen3-fp8")
    parsed = WeightCache.model_validate(stored)
    assert stored["spec"] == parsed.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert stored["spec"]["daemon"]["backend"] == "cuda-vmm"
    assert stored["spec"]["model"]["quantization"] == {"method": "fp8", "weightBlockSize": [128, 128]}


@pytest.mark.parametrize("example", ["weightcache-vllm-cpu.yaml", "weightcache-vllm-gpu.yaml"])
def test_vllm_examples_are_stored_as_written_with_the_models_defaults(
    cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str, example: str
) -> None:
    """The vLLM examples pass the API server's schema, and what it stores (spec.engine.vllm with
    its defaults) parses back into the same model."""
    text = SAMPLE_PATH.with_name(example).read_text()
    cluster.apply(text, namespace=namespace)
    stored = kube.get(f"{collection(namespace)}/{yaml.safe_load(text)['metadata']['name']}")
    parsed = WeightCache.model_validate(stored)
    assert stored["spec"] == parsed.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert parsed.spec.engine.vllm is not None and stored["spec"]["engine"][
        "vllm"
    ] == parsed.spec.engine.vllm.model_dump(by_alias=True, exclude_none=True, mode="json")


def test_printer_columns(cluster: ControlPlane, kube: Kube, weightcache_crd: str, namespace: str) -> None:
    cluster.apply(SAMPLE_PATH.read_text(), namespace=namespace)
    header = cluster.kubectl("get", "wc", "-n", namespace).stdout.splitlines()[0].split()
    assert header == [
        "NAME",
        "PHASE",
        "CHANGE",
        "READY",
        "NODES",
        "ACTIVE",
        "STANDBY",
        "SERVED",
        "MODEL",
        "MODEL",
        "AGE",
        "MESSAGE",
    ]
    kube.patch(
        f"{collection(namespace)}/tiny-llama/status",
        {
            "status": {
                "phase": "Ready",
                "readyNodes": "1/1",
                "activeEngines": 1,
                "standbyEngines": 1,
                "servedModelName": "tiny-llama",
                "model": "/models/tiny-llama@seed-0",
            }
        },
        content_type=MERGE,
    )
    row = cluster.kubectl("get", "wc", "tiny-llama", "-n", namespace, "--no-headers").stdout.split()
    assert row[:7] == ["tiny-llama", "Ready", "1/1", "1", "1", "tiny-llama", "/models/tiny-llama@seed-0"]
    kube.patch(
        f"{collection(namespace)}/tiny-llama/status", {"status": {"generationChange": "BlueGreen"}}, content_type=MERGE
    )
    row = cluster.kubectl("get", "wc", "tiny-llama", "-n", namespace, "--no-headers").stdout.split()
    assert row[:3] == ["tiny-llama", "Ready", "BlueGreen"], row


GPU_VARIANT = {
    "model": {
        "source": {"pvc": {"claimName": "models", "subPath": "deepseek-v3"}},
        "revision": "abc123",
        "dtype": "bfloat16",
        "quantization": {"method": "fp8"},
    },
    "parallelism": {"tensor": 8, "pipeline": 2, "nodes": 2},
    "placement": {
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["llm"]}]}]
                }
            }
        },
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "daemon": {
        "image": "weightcache/daemon:0.1.0",
        "backend": "cuda-vmm",
        "extraArgs": ["--keeper"],
        "resources": {"requests": {"cpu": "4", "memory": "16Gi"}},
    },
    "engine": {
        "replicas": 2,
        "standbysPerReplica": 1,
        "gpuAccess": "dra",
        "weightFallback": "error",
        "template": {
            "metadata": {"labels": {"app": "llm"}},
            "spec": {
                "containers": [
                    {"name": "sglang", "image": "lmsysorg/sglang:latest", "env": [{"name": "X", "value": "1"}]}
                ],
                "priorityClassName": "inference",
            },
        },
    },
    "service": {"name": "llm", "port": 80, "type": "LoadBalancer"},
}


def test_gpu_variant_is_stored_whole(kube: Kube, weightcache_crd: str, namespace: str) -> None:
    obj = {"apiVersion": API_VERSION, "kind": "WeightCache", "metadata": {"name": "gpu"}, "spec": GPU_VARIANT}
    stored = kube.create(collection(namespace), obj)
    # Free-form Kubernetes objects (affinity, resources, pod template) are kept, not pruned.
    assert stored["spec"]["placement"] == GPU_VARIANT["placement"]
    assert stored["spec"]["engine"]["template"] == GPU_VARIANT["engine"]["template"]
    assert stored["spec"]["daemon"]["resources"] == GPU_VARIANT["daemon"]["resources"]
    parsed = WeightCache.model_validate(stored)
    assert stored["spec"] == parsed.spec.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert parsed.spec.parallelism.ranks_per_node == 8


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation of the sample: sets spec.<path> (dotted) to value."""

    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = obj["spec"]
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return mutate


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = obj["spec"]
        for key in parents:
            node = node[key]
        del node[last]

    return mutate


BOTH_SOURCES = {"hostPath": {"path": "/models/a"}, "pvc": {"claimName": "models"}}

# (id, mutation of the sample, what the API server's answer must contain)
INVALID = [
    (
        "bad-backend",
        _set("daemon.backend", "rocm"),
        'spec.daemon.backend: Unsupported value: "rocm": supported values: "cuda-vmm", "cuda-ipc", "cpu-shm"',
    ),
    (
        "tensor-0",
        _set("parallelism.tensor", 0),
        "spec.parallelism.tensor: Invalid value: 0: spec.parallelism.tensor in body should be greater than or equal to 1",
    ),
    (
        "port-70000",
        _set("engine.port", 70000),
        "spec.engine.port: Invalid value: 70000: spec.engine.port in body should be less than or equal to 65535",
    ),
    (
        "both-sources",
        _set("model.source", BOTH_SOURCES),
        "spec.model.source: Invalid value: exactly one of hostPath or pvc must be set",
    ),
    ("no-source", _set("model.source", {}), "exactly one of hostPath or pvc must be set"),
    ("bad-dtype", _set("model.dtype", "int8"), 'spec.model.dtype: Unsupported value: "int8"'),
    (
        "negative-replicas",
        _set("engine.replicas", -1),
        "spec.engine.replicas in body should be greater than or equal to 0",
    ),
    (
        "negative-standbys",
        _set("engine.standbysPerReplica", -2),
        "spec.engine.standbysPerReplica in body should be greater than or equal to 0",
    ),
    (
        "unknown-quantization",
        _set("model.quantization", {"method": "awq"}),
        'spec.model.quantization.method: Unsupported value: "awq": supported values: "none", "fp8"',
    ),
    (
        "zero-block",
        _set("model.quantization", {"method": "fp8", "weightBlockSize": [0, 128]}),
        "spec.model.quantization.weightBlockSize[0]: Invalid value: 0:",
    ),
    (
        "one-block-dim",
        _set("model.quantization", {"method": "fp8", "weightBlockSize": [128]}),
        "spec.model.quantization.weightBlockSize: Invalid value: 1: spec.model.quantization.weightBlockSize in body "
        "should have at least 2 items",
    ),
    (
        "ranks-not-multiple-of-nodes",
        _set("parallelism", {"tensor": 3, "nodes": 2}),
        "tensor * pipeline (the number of ranks) must be a multiple of nodes",
    ),
    (
        "expert-not-dividing-tensor",
        _set("parallelism", {"tensor": 4, "expert": 3}),
        "expert must divide tensor: expert-parallel ranks are tensor-parallel ranks",
    ),
    ("dra-on-cpu", _set("engine.gpuAccess", "dra"), "engine.gpuAccess dra shares a GPU ResourceClaim"),
    (
        "relative-host-path",
        _set("model.source", {"hostPath": {"path": "models/a"}}),
        "spec.model.source.hostPath.path in body should match '^/'",
    ),
    (
        "no-containers",
        _set("engine.template", {"spec": {"containers": []}}),
        "spec.engine.template.spec.containers in body should have at least 1 items",
    ),
    ("no-daemon-image", _delete("daemon.image"), "spec.daemon.image: Required value"),
    ("bad-service-type", _set("service", {"type": "ExternalName"}), "spec.service.type: Unsupported value"),
    (
        "unresponsive-below-floor",
        _set("engine.failover", {"unresponsiveAfterMilliseconds": 50}),
        "spec.engine.failover.unresponsiveAfterMilliseconds: Invalid value: 50: "
        "unresponsiveAfterMilliseconds must be 0 (off) or at least 100",
    ),
    (
        "reference-pool-unnamed",
        _set("routing", {"inferencePool": {"mode": "Reference"}}),
        "inferencePool.mode Reference needs inferencePool.name, the InferencePool to check",
    ),
    (
        "reference-pool-with-picker",
        _set(
            "routing",
            {"inferencePool": {"mode": "Reference", "name": "mine", "endpointPickerRef": {"name": "e", "port": 9002}}},
        ),
        "inferencePool.endpointPickerRef is rendered into a managed pool only",
    ),
    (
        "pool-failure-mode",
        _set(
            "routing",
            {
                "inferencePool": {
                    "mode": "Managed",
                    "endpointPickerRef": {"name": "e", "port": 9002, "failureMode": "Open"},
                }
            },
        ),
        'spec.routing.inferencePool.endpointPickerRef.failureMode: Unsupported value: "Open"',
    ),
]


@pytest.mark.parametrize(("mutate", "message"), [pytest.param(m, msg, id=i) for i, m, msg in INVALID])
def test_invalid_objects_are_refused(
    kube: Kube, weightcache_crd: str, namespace: str, mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    obj = sample("bad")
    mutate(obj)
    with pytest.raises(ApiError) as refused:
        kube.create(collection(namespace), obj)
    assert refused.value.status == 422, refused.value
    assert message in str(refused.value)


def test_model_source_is_immutable(kube: Kube, weightcache_crd: str, namespace: str) -> None:
    path = f"{collection(namespace)}/pinned"
    kube.create(collection(namespace), sample("pinned"))
    for source in ({"hostPath": {"path": "/models/other"}}, {"hostPath": None, "pvc": {"claimName": "models"}}):
        with pytest.raises(ApiError) as refused:
            kube.patch(path, {"spec": {"model": {"source": source}}}, content_type=MERGE)
        assert refused.value.status == 422
        assert "spec.model.source: Invalid value: the model source is immutable" in str(refused.value)
    # Everything else in spec stays mutable: scaling must not need a new object.
    scaled = kube.patch(
        path, {"spec": {"engine": {"replicas": 3}, "model": {"revision": "seed-1"}}}, content_type=MERGE
    )
    assert scaled["spec"]["engine"]["replicas"] == 3
    assert scaled["metadata"]["generation"] == 2


def test_status_subresource(kube: Kube, weightcache_crd: str, namespace: str) -> None:
    path = f"{collection(namespace)}/statusful"
    kube.create(collection(namespace), sample("statusful"))
    ignored = kube.patch(path, {"status": {"phase": "Ready"}}, content_type=MERGE)
    assert "status" not in ignored
    status = {
        "observedGeneration": 1,
        "phase": "Loading",
        "conditions": [
            {
                "type": "DaemonsReady",
                "status": "False",
                "reason": "Loading",
                "message": "1 of 2 ranks ready on node-1",
                "lastTransitionTime": "2026-11-29T09:00:00Z",
                "observedGeneration": 1,
            }
        ],
        "nodes": [
            {
                "node": "node-1",
                "daemonPod": "statusful-daemon-abcde",
                "ranks": [
                    {"rank": 0, "ready": True, "bytes": 302_000_000, "loadSeconds": 0.93, "gpuUuid": "GPU-0"},
                    {"rank": 1, "ready": False},
                ],
            }
        ],
        "engines": [{"replica": 0, "active": "statusful-engine-0-a", "standbys": ["statusful-engine-0-b"]}],
        "daemonSpecHash": "0123abcd",
    }
    written = kube.patch(f"{path}/status", {"status": status}, content_type=MERGE)
    assert written["status"] == status
    assert written["metadata"]["generation"] == 1
    # What the operator writes, the models read back unchanged.
    parsed = WeightCache.model_validate(written)
    assert parsed.status is not None
    assert parsed.status.model_dump(by_alias=True, exclude_none=True, mode="json") == status
    with pytest.raises(ApiError) as refused:
        kube.patch(f"{path}/status", {"status": {"phase": "Sleeping"}}, content_type=MERGE)
    assert 'status.phase: Unsupported value: "Sleeping"' in str(refused.value)
    # A spec change through the main resource leaves the status alone.
    updated = kube.patch(path, {"spec": {"engine": {"replicas": 2}}, "status": {"phase": "Failed"}}, content_type=MERGE)
    assert updated["status"]["phase"] == "Loading"
    assert updated["metadata"]["generation"] == 2
    assert updated["status"] == written["status"]
