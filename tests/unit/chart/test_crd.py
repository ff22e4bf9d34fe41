"""The checked-in CRD is the generated one, its schema is structural, and its defaults are the
models' defaults. The API server's own verdict on the schema is in tests/e2e/test_crd_e2e.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel
from repo_root import ROOT
from weightcache_operator import crd, spec


def test_checked_in_crd_is_the_generated_one() -> None:
    checked_in = (ROOT / "crds" / "weightcache.yaml").read_text()
    assert checked_in == crd.render(), (
        "crds/weightcache.yaml differs from the models in operator/weightcache_operator/spec/; "
        f"regenerate it with `PYTHONPATH=contract:operator {crd.COMMAND}` and commit the result"
    )


def test_command_prints_and_writes_the_same_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crd.main([]) == 0
    printed = capsys.readouterr().out
    assert crd.main(["--write", str(tmp_path / "out.yaml")]) == 0
    assert printed == (tmp_path / "out.yaml").read_text() == crd.render()
    assert yaml.safe_load(printed) == crd.custom_resource_definition()


def test_module_command_runs() -> None:
    """The command the Makefile runs, as a real process (catches import-order mistakes)."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(str(ROOT / p) for p in ("contract", "operator"))}
    result = subprocess.run(
        [sys.executable, "-m", "weightcache_operator.crd"], capture_output=True, text=True, env=environment, check=True
    )
    assert result.stdout == crd.render()


def schema_nodes(node: dict[str, Any], where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield where, node
    for name, child in node.get("properties", {}).items():
        yield from schema_nodes(child, f"{where}.{name}")
    if isinstance(node.get("items"), dict):
        yield from schema_nodes(node["items"], f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from schema_nodes(node["additionalProperties"], f"{where}{{}}")


def openapi() -> dict[str, Any]:
    return crd.custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_schema_is_structural() -> None:
    nodes = list(schema_nodes(openapi()))
    assert len(nodes) > 60
    for where, node in nodes:
        for forbidden in ("$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "prefixItems", "title", "const"):
            assert forbidden not in node, f"{where}: {forbidden}"
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), f"{where}: no type"
        assert not ("properties" in node and "additionalProperties" in node), where
        assert not isinstance(node.get("additionalProperties"), bool), where
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(bound, True), bool), f"{where}: {bound} must be a boolean in OpenAPI v3.0"
        assert node.get("default", "unset") is not None, f"{where}: null default"
        for name in node.get("required", []):
            assert name in node["properties"], f"{where}: required {name} is not a property"


def test_free_form_objects_keep_unknown_fields() -> None:
    nodes = dict(schema_nodes(openapi()))
    for where in (
        ".spec.placement.affinity",
        ".spec.placement.tolerations[]",
        ".spec.daemon.resources",
        ".spec.engine.template.metadata",
        ".spec.engine.template.spec",
        ".spec.engine.template.spec.containers[]",
    ):
        assert nodes[where]["type"] == "object"
        assert nodes[where]["x-kubernetes-preserve-unknown-fields"] is True, where
    assert nodes[".spec.placement.nodeSelector"]["additionalProperties"] == {"type": "string"}


def test_structural_refuses_what_it_cannot_express() -> None:
    class Either(BaseModel):
        value: int | str

    with pytest.raises(crd.UnsupportedSchema, match=r"\.value: anyOf with 2 non-null branches"):
        crd.structural(Either.model_json_schema())


EXPECTED_DEFAULTS = {
    ".spec.model.dtype": "auto",
    ".spec.model.onChange": "Report",
    ".spec.model.quantization": {"method": "none", "weightBlockSize": [128, 128]},
    ".spec.model.quantization.method": "none",
    ".spec.model.quantization.weightBlockSize": [128, 128],
    ".spec.parallelism": {"tensor": 1, "pipeline": 1, "nodes": 1, "expert": 1},
    ".spec.parallelism.tensor": 1,
    ".spec.parallelism.pipeline": 1,
    ".spec.parallelism.nodes": 1,
    ".spec.parallelism.expert": 1,
    ".spec.placement": {},
    ".spec.daemon.backend": "cuda-vmm",
    ".spec.daemon.extraArgs": [],
    ".spec.daemon.generationChange": "Auto",
    ".spec.daemon.seeding": {
        "mode": "Peers",
        "maxMiBPerSecond": 4096.0,
        "maxClients": 2,
        "streams": 4,
        "stallSeconds": 10.0,
        "minMiBPerSecond": 1.0,
    },
    ".spec.daemon.seeding.mode": "Peers",
    ".spec.daemon.seeding.maxMiBPerSecond": 4096.0,
    ".spec.daemon.seeding.maxClients": 2,
    ".spec.daemon.seeding.streams": 4,
    ".spec.daemon.seeding.stallSeconds": 10.0,
    ".spec.daemon.seeding.minMiBPerSecond": 1.0,
    ".spec.engine.replicas": 1,
    ".spec.engine.standbysPerReplica": 0,
    ".spec.engine.port": 8000,
    ".spec.engine.gpuAccess": "visibleDevices",
    ".spec.engine.dra.deviceClassName": "gpu.nvidia.com",
    ".spec.engine.weightFallback": "disk",
    ".spec.engine.preStopSleepSeconds": 5,
    ".spec.engine.sglang.args": [],
    ".spec.engine.sglang.engineArgs": [],
    ".spec.engine.vllm.args": [],
    ".spec.engine.vllm.engineArgs": [],
    ".spec.engine.vllm.artifactCache.maxBytes": 8 << 30,
    ".spec.engine.rollout": {"readyDeadlineSeconds": 600, "maxSurge": 1},
    ".spec.engine.rollout.readyDeadlineSeconds": 600,
    ".spec.engine.rollout.maxSurge": 1,
    ".spec.engine.failover": {
        "daemonOutageGraceSeconds": 30,
        "keepWarmSeconds": 30,
        "unresponsiveAfterMilliseconds": 0,
    },
    ".spec.engine.failover.daemonOutageGraceSeconds": 30,
    ".spec.engine.failover.keepWarmSeconds": 30,
    ".spec.engine.failover.unresponsiveAfterMilliseconds": 0,
    ".spec.service": {"port": 8000, "type": "ClusterIP"},
    ".spec.service.port": 8000,
    ".spec.service.type": "ClusterIP",
    ".spec.routing.inferencePool.endpointPickerRef.failureMode": "FailClose",
}


def test_spec_defaults_are_as_specified() -> None:
    defaults = {where: node["default"] for where, node in schema_nodes(openapi()) if "default" in node}
    spec_defaults = {where: value for where, value in defaults.items() if where.startswith(".spec.")}
    assert spec_defaults == EXPECTED_DEFAULTS


def test_enums_and_bounds() -> None:
    nodes = dict(schema_nodes(openapi()))
    assert nodes[".spec.daemon.backend"]["enum"] == ["cuda-vmm", "cuda-ipc", "cpu-shm"]
    assert nodes[".spec.model.dtype"]["enum"] == ["auto", "bfloat16", "float16", "float32"]
    assert nodes[".spec.model.quantization.method"]["enum"] == ["none", "fp8"]
    assert nodes[".spec.engine.gpuAccess"]["enum"] == ["visibleDevices", "dra"]
    assert nodes[".spec.engine.weightFallback"]["enum"] == ["disk", "error"]
    assert nodes[".spec.service.type"]["enum"] == ["ClusterIP", "NodePort", "LoadBalancer"]
    assert nodes[".status.phase"]["enum"] == ["Pending", "Loading", "Ready", "Degraded", "Failed"]
    assert nodes[".status.conditions[]"]["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert nodes[".spec.model.quantization.weightBlockSize[]"] == {
        "type": "integer",
        "exclusiveMinimum": True,
        "minimum": 0,
    }
    assert (nodes[".spec.engine.port"]["minimum"], nodes[".spec.engine.port"]["maximum"]) == (1, 65535)
    for field in ("tensor", "pipeline", "nodes", "expert"):
        assert nodes[f".spec.parallelism.{field}"]["minimum"] == 1
    for field in ("replicas", "standbysPerReplica"):
        assert nodes[f".spec.engine.{field}"]["minimum"] == 0
    assert nodes[".spec"]["required"] == ["model", "daemon", "engine"]
    assert nodes[".status.conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_cel_rules_are_the_models_rules() -> None:
    nodes = dict(schema_nodes(openapi()))
    assert nodes[".spec.model.source"]["x-kubernetes-validations"] == [spec.SOURCE_EXACTLY_ONE, spec.SOURCE_IMMUTABLE]
    assert nodes[".spec.parallelism"]["x-kubernetes-validations"] == [
        spec.RANKS_DIVIDE_NODES,
        spec.EXPERT_DIVIDES_TENSOR,
    ]
    assert nodes[".spec"]["x-kubernetes-validations"] == [spec.DRA_NEEDS_GPU]
    unresponsive = nodes[".spec.engine.failover.unresponsiveAfterMilliseconds"]
    assert unresponsive["x-kubernetes-validations"] == [spec.UNRESPONSIVE_FLOOR]
    assert nodes[".spec.routing.inferencePool"]["x-kubernetes-validations"] == [
        spec.POOL_REFERENCE_NAMED,
        spec.POOL_PICKER_MANAGED,
    ]
    rules = [where for where, node in nodes.items() if "x-kubernetes-validations" in node]
    assert sorted(rules) == [
        ".spec",
        ".spec.engine.failover.unresponsiveAfterMilliseconds",
        ".spec.model.source",
        ".spec.parallelism",
        ".spec.routing.inferencePool",
    ]


def test_resource_names_columns_and_subresources() -> None:
    definition = crd.custom_resource_definition()
    assert definition["metadata"]["name"] == "weightcaches.weightcache.io"
    assert definition["spec"]["scope"] == "Namespaced"
    assert definition["spec"]["names"]["shortNames"] == ["wc"]
    (version,) = definition["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}
    columns = [(c["name"].upper(), c["jsonPath"]) for c in version["additionalPrinterColumns"]]
    assert columns == [
        ("PHASE", ".status.phase"),
        ("CHANGE", ".status.generationChange"),
        ("READY NODES", ".status.readyNodes"),
        ("ACTIVE", ".status.activeEngines"),
        ("STANDBY", ".status.standbyEngines"),
        ("SERVED MODEL", ".status.servedModelName"),
        ("MODEL", ".status.model"),
        ("AGE", ".metadata.creationTimestamp"),
        ("MESSAGE", ".status.message"),
    ]
    status_fields = set(openapi()["properties"]["status"]["properties"])
    for _, path in columns:
        if path.startswith(".status."):
            assert path.removeprefix(".status.") in status_fields
