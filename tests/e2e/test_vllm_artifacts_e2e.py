"""examples/weightcache-vllm-cpu.yaml with vLLM's compilation on (no --enforce-eager) and
``spec.engine.vllm.artifactCache`` on the real control plane, pinned to one node: the first engine
finds nothing for its key, compiles, and its daemon publishes the artifacts once it serves; a
second engine on the node (a standby added afterwards) starts from that entry, its log says so,
and ``status.nodes[].artifacts`` counts one miss, one published entry and one hit."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from operator_e2e import is_ready, wait_phase
from test_rollout_e2e import apply
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import VLLM_SAMPLE, pods, sample
from testcluster.waiting import wait_for
from vllm_e2e import ENGINES, NAME, engine_log, read_from_disk, vllm_checkpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e
WC = "/apis/weightcache.io/v1alpha1/namespaces/{}/weightcaches/" + NAME


def compiled_cache(node: str, standbys: int) -> dict[str, Any]:
    body = sample(VLLM_SAMPLE)
    spec = body["spec"]
    spec["engine"]["vllm"]["args"] = []  # compilation on: what the artifacts are for
    spec["engine"]["vllm"]["artifactCache"] = {"maxBytes": 1 << 30}
    spec["engine"]["standbysPerReplica"] = standbys
    spec["placement"]["nodeSelector"]["kubernetes.io/hostname"] = node  # both engines on one node
    return dict(body)


def node_artifacts(kube: Kube, namespace: str, node: str) -> dict[str, Any]:
    nodes = (kube.get(WC.format(namespace)).get("status") or {}).get("nodes") or []
    return dict(next((n.get("artifacts") or {} for n in nodes if n["node"] == node), {}))


def test_a_second_vllm_engine_on_the_node_starts_from_the_first_ones_compile_artifacts(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    vllm_checkpoint: Path,
) -> None:
    node = kubelet.config.nodes[0].name
    apply(cluster, namespace, compiled_cache(node, standbys=0))
    wait_phase(kube, namespace, operator, "Ready", timeout=600, name=NAME)
    (first,) = pods(kube, namespace, ENGINES)
    first_name = first["metadata"]["name"]
    assert first["spec"]["containers"][0]["command"][3] == "artifacts-run"
    assert "Compile artifacts: miss" in engine_log(kubelet, namespace, first_name)
    wait_for(
        lambda: node_artifacts(kube, namespace, node).get("published") == 1,
        120,
        interval=1,
        describe=lambda: node_artifacts(kube, namespace, node),
    )

    apply(cluster, namespace, compiled_cache(node, standbys=1))

    def second_ready() -> dict[str, Any] | None:
        second = [p for p in pods(kube, namespace, ENGINES) if p["metadata"]["name"] != first_name]
        return second[0] if second and is_ready(second[0]) else None

    second = wait_for(second_ready, 600, interval=1, describe=lambda: pods(kube, namespace, ENGINES))
    assert second["spec"]["nodeName"] == node
    log = engine_log(kubelet, namespace, second["metadata"]["name"])
    assert "Compile artifacts: hit" in log, log[-4000:]
    assert not read_from_disk(kubelet, namespace, second["metadata"]["name"])
    seen = wait_for(
        lambda: (a := node_artifacts(kube, namespace, node)).get("hits") == 1 and a,
        120,  # the operator reads a ready daemon's report again every 30 s (daemon_status.py)
        interval=1,
        describe=lambda: node_artifacts(kube, namespace, node),
    )
    assert (seen["misses"], seen["published"], seen["entries"]) == (1, 1, 1), seen
    assert seen["bytes"] > 0 and "problem" not in seen, seen
