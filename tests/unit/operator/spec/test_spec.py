"""The WeightCache models: they accept the sample, apply the documented defaults, and refuse
mistakes with messages that name the field and say what to fix. Each CEL rule in the CRD has
a Python twin here, so the operator never trusts a spec the API server would have refused."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from repo_root import ROOT
from weightcache_operator.spec import Parallelism, WeightCache, WeightCacheSpec, WeightCacheStatus

SAMPLE = ROOT / "examples" / "weightcache-cpu.yaml"


def test_gpu_sample_is_valid_and_its_gpu_holder_asks_for_every_rank_s_gpu() -> None:
    """examples/weightcache-gpu.yaml, the README's variant for real clusters: no validation
    problem, cuda-vmm with block-FP8, one GPU per local rank on the GPU holder, none on daemons
    (so two generations' daemons can share them) or engines."""
    from weightcache_operator.observe.validation import parse
    from weightcache_operator.render import engine_pod
    from weightcache_operator.render.daemon import daemon_daemonsets
    from weightcache_operator.render.gpu_holder import gpu_holder_daemonset

    body = yaml.safe_load(SAMPLE.with_name("weightcache-gpu.yaml").read_text())
    body["metadata"].update(namespace="default", uid="0000", generation=1)
    cache, problems = parse(body)
    assert cache is not None and problems == []
    assert (cache.spec.daemon.backend, cache.spec.model.quantization.method) == ("cuda-vmm", "fp8")
    [daemonset] = daemon_daemonsets(cache, [])
    daemon = next(c for c in daemonset["spec"]["template"]["spec"]["containers"] if c["name"] == "daemon")
    assert "nvidia.com/gpu" not in str(daemon["resources"]) and daemon["resources"]["limits"] == {"memory": "64Gi"}
    holder = gpu_holder_daemonset(cache, [])
    assert holder is not None
    gpus = holder["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert gpus["requests"]["nvidia.com/gpu"] == "8" == gpus["limits"]["nvidia.com/gpu"]
    engine = engine_pod(cache, 0, "active", ["node-a"])["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in str(engine.get("resources"))
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in engine["env"]


def sample_spec() -> dict[str, Any]:
    return yaml.safe_load(SAMPLE.read_text())["spec"]


def test_sample_parses_with_defaults() -> None:
    cache = WeightCache.model_validate(yaml.safe_load(SAMPLE.read_text()))
    s = cache.spec
    assert s.model.source.host_path is not None and s.model.source.host_path.path == "/models/tiny-llama"
    assert s.model.source.pvc is None
    assert (s.model.dtype, s.model.revision) == ("float32", "seed-0")
    assert (s.model.quantization.method, s.model.quantization.weight_block_size) == ("none", [128, 128])
    assert (s.parallelism.tensor, s.parallelism.pipeline, s.parallelism.nodes) == (2, 1, 1)
    assert (s.parallelism.ranks, s.parallelism.ranks_per_node) == (2, 2)
    assert s.daemon.backend == "cpu-shm" and s.daemon.extra_args == []
    assert (s.engine.replicas, s.engine.standbys_per_replica, s.engine.port) == (1, 1, 8000)
    assert (s.engine.gpu_access, s.engine.weight_fallback) == ("visibleDevices", "disk")
    assert s.engine.template.spec.containers[0]["command"] == ["python", "-m", "weightcache", "engine"]
    assert (s.service.name, s.service.port, s.service.type) == (None, 8000, "ClusterIP")
    assert s.placement.node_selector == {"weightcache.io/test-node": "true"}
    assert cache.status is None


def test_wire_names_are_camel_case_and_round_trip() -> None:
    raw = sample_spec()
    raw["model"]["source"] = {"pvc": {"claimName": "models", "subPath": "qwen3"}}
    raw["model"]["quantization"] = {"method": "fp8", "weightBlockSize": [64, 128]}
    raw["engine"]["template"]["spec"]["nodeName"] = "kept-as-is"
    raw["placement"]["tolerations"] = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    parsed = WeightCacheSpec.model_validate(raw)
    assert parsed.model.source.pvc is not None and parsed.model.source.pvc.sub_path == "qwen3"
    dumped = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["model"]["source"] == {"pvc": {"claimName": "models", "subPath": "qwen3"}}
    assert dumped["model"]["quantization"]["weightBlockSize"] == [64, 128]
    assert dumped["engine"]["template"]["spec"]["nodeName"] == "kept-as-is"  # pod spec passes through
    assert dumped["placement"]["tolerations"] == raw["placement"]["tolerations"]
    assert {"standbysPerReplica", "gpuAccess", "weightFallback"} <= set(dumped["engine"])
    assert WeightCacheSpec.model_validate(dumped) == parsed
    # Python names work too, for the operator's own code.
    assert Parallelism(tensor=4, nodes=2).ranks_per_node == 2


def test_status_parses_what_the_operator_writes() -> None:
    status = WeightCacheStatus.model_validate(
        {
            "observedGeneration": 3,
            "phase": "Degraded",
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "InvalidSpec",
                    "message": "m",
                    "lastTransitionTime": "2026-11-29T09:00:00Z",
                    "observedGeneration": 3,
                }
            ],
            "nodes": [
                {
                    "node": "node-1",
                    "daemonPod": "d",
                    "ranks": [{"rank": 0, "ready": True, "bytes": 10, "loadSeconds": 0.5, "gpuUuid": "GPU-1"}],
                }
            ],
            "engines": [{"replica": 0, "active": "e-0", "standbys": ["e-1"]}],
            "daemonSpecHash": "abc",
            "readyNodes": "1/1",
            "activeEngines": 1,
            "standbyEngines": 1,
            "model": "/models/x",
        }
    )
    assert status.conditions[0].last_transition_time is not None
    assert status.conditions[0].last_transition_time.year == 2026
    assert status.nodes[0].ranks[0].gpu_uuid == "GPU-1"
    assert status.engines[0].standbys == ["e-1"]
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["conditions"][0]["lastTransitionTime"] == "2026-11-29T09:00:00Z"


def setting(path: str, value: Any) -> dict[str, Any]:
    raw = sample_spec()
    *parents, last = path.split(".")
    node = raw
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return raw


DELETE = object()

# (id, spec field, new value, (location of the error, words the message must contain))
BAD = [
    ("bad-backend", "daemon.backend", "rocm", ("daemon.backend", "'cuda-vmm', 'cuda-ipc' or 'cpu-shm'")),
    ("tensor-0", "parallelism.tensor", 0, ("parallelism.tensor", "greater than or equal to 1")),
    ("port-70000", "engine.port", 70000, ("engine.port", "less than or equal to 65535")),
    (
        "both-sources",
        "model.source",
        {"hostPath": {"path": "/a"}, "pvc": {"claimName": "m"}},
        ("model.source", "exactly one of hostPath or pvc must be set"),
    ),
    ("no-source", "model.source", {}, ("model.source", "exactly one of hostPath or pvc must be set")),
    ("bad-dtype", "model.dtype", "int8", ("model.dtype", "'auto', 'bfloat16', 'float16' or 'float32'")),
    ("negative-replicas", "engine.replicas", -1, ("engine.replicas", "greater than or equal to 0")),
    ("negative-standbys", "engine.standbysPerReplica", -1, ("engine.standbysPerReplica", "greater than or equal to 0")),
    ("unknown-quantization", "model.quantization", {"method": "awq"}, ("model.quantization.method", "'none' or 'fp8'")),
    (
        "zero-block",
        "model.quantization",
        {"method": "fp8", "weightBlockSize": [0, 128]},
        ("model.quantization.weightBlockSize.0", "greater than 0"),
    ),
    (
        "one-block-dim",
        "model.quantization",
        {"method": "fp8", "weightBlockSize": [128]},
        ("model.quantization.weightBlockSize", "at least 2 items"),
    ),
    (
        "ranks-not-multiple-of-nodes",
        "parallelism",
        {"tensor": 3, "nodes": 2},
        ("parallelism", "must be a multiple of nodes (tensor 3 * pipeline 1 = 3 ranks over 2 nodes)"),
    ),
    (
        "expert-not-dividing-tensor",
        "parallelism",
        {"tensor": 4, "expert": 3},
        (
            "parallelism",
            "expert must divide tensor: expert-parallel ranks are tensor-parallel ranks, each run of "
            "tensor/expert of them holding 1/expert of the experts (tensor 4, expert 3)",
        ),
    ),
    ("dra-on-cpu", "engine.gpuAccess", "dra", ("", "needs a GPU daemon backend")),
    (
        "relative-host-path",
        "model.source",
        {"hostPath": {"path": "models/a"}},
        ("model.source.hostPath.path", "should match pattern '^/'"),
    ),
    (
        "no-containers",
        "engine.template",
        {"spec": {"containers": []}},
        ("engine.template.spec.containers", "at least 1 item"),
    ),
    ("no-daemon-image", "daemon.image", DELETE, ("daemon.image", "Field required")),
    ("bad-service-type", "service", {"type": "ExternalName"}, ("service.type", "'ClusterIP', 'NodePort'")),
    ("typo-in-field", "engine.standbys", 1, ("engine.standbys", "Extra inputs are not permitted")),
    (
        "negative-outage-grace",
        "engine.failover",
        {"daemonOutageGraceSeconds": -1},
        ("engine.failover.daemonOutageGraceSeconds", "greater than or equal to 0"),
    ),
    (
        "hour-plus-outage-grace",
        "engine.failover",
        {"daemonOutageGraceSeconds": 3601},
        ("engine.failover.daemonOutageGraceSeconds", "less than or equal to 3600"),
    ),
    (
        "unresponsive-below-floor",
        "engine.failover",
        {"unresponsiveAfterMilliseconds": 50},
        ("engine.failover", "must be 0 (off) or at least 100, not 50"),
    ),
    (
        "unresponsive-over-a-minute",
        "engine.failover",
        {"unresponsiveAfterMilliseconds": 60001},
        ("engine.failover.unresponsiveAfterMilliseconds", "less than or equal to 60000"),
    ),
]


@pytest.mark.parametrize(("path", "value", "expected"), [pytest.param(p, v, e, id=i) for i, p, v, e in BAD])
def test_mistakes_are_refused_with_useful_messages(path: str, value: Any, expected: tuple[str, str]) -> None:
    where, words = expected
    with pytest.raises(ValidationError) as refused:
        WeightCacheSpec.model_validate(setting(path, value))
    errors = refused.value.errors()
    assert len(errors) == 1, errors
    assert ".".join(map(str, errors[0]["loc"])) == where
    assert words in errors[0]["msg"]
