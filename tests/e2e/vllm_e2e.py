"""What the vLLM e2e scenarios share: examples/weightcache-vllm-cpu.yaml applied as written (a
tiny Qwen3 served by ``vllm serve --load-format weightcache`` over daemons of the ``vllm``
profile), its checkpoint on every node, the greedy token ids of vLLM loading that checkpoint from
disk, the same request through the Service, and how an engine got its weights: the daemons count
the arena maps they served (their status endpoint), and an engine that falls back to reading the
checkpoint says so in its log."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from operator_e2e import http_json
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import (
    VLLM_SAMPLE,
    completion_by_ids,
    daemons_of,
    engines_of,
    place_checkpoint,
    pods,
    sample,
    vllm_disk_token_ids,
)
from testcluster.serviceproxy import ServiceProxy

NAME = str(sample(VLLM_SAMPLE)["metadata"]["name"])
ENGINES = engines_of(NAME)
DAEMONS = daemons_of(NAME)
FROM_DISK = f"weightcache {NAME!r} rank 0: loading from disk"
"""The plug-in's warning when an engine falls back to reading the checkpoint."""


@pytest.fixture(scope="module")
def vllm_checkpoint(kubelet: ProcessKubelet, generated_checkpoints: Callable[[Path, str], Path]) -> Path:
    """The example's checkpoint at its hostPath (/models/tiny-qwen3) on every node."""
    made = generated_checkpoints(VLLM_SAMPLE, NAME)
    place_checkpoint(made, [kubelet.node_root(node.name) for node in kubelet.config.nodes], VLLM_SAMPLE)
    return made


@pytest.fixture(scope="module")
def disk_token_ids(vllm_checkpoint: Path) -> list[int]:
    """vLLM's greedy ids for the prompt with its default loader on the same checkpoint and the
    same vLLM arguments the engines get."""
    return vllm_disk_token_ids(vllm_checkpoint)


def apply_example(cluster: ControlPlane, namespace: str) -> None:
    """examples/weightcache-vllm-cpu.yaml exactly as the file is written."""
    cluster.kubectl("apply", "-n", namespace, "-f", str(VLLM_SAMPLE))


def served_token_ids(proxy: ServiceProxy) -> list[int]:
    """The greedy completion of the prompt through the Service, as token ids, asked for by the
    cache's name (what ``kubectl get wc`` shows), as a client would."""
    host, port = proxy.address
    return list(http_json(f"http://{host}:{port}/v1/completions", completion_by_ids(NAME))["choices"][0]["token_ids"])


def engine_log(kubelet: ProcessKubelet, namespace: str, pod: str) -> str:
    return kubelet.logs(namespace, pod, "engine")


def read_from_disk(kubelet: ProcessKubelet, namespace: str, pod: str) -> bool:
    """The engine fell back to loading the checkpoint instead of mapping the arena."""
    return FROM_DISK in engine_log(kubelet, namespace, pod)


def maps_served(kube: Kube, namespace: str) -> int:
    """Arena maps the cache's daemons handed to engines (every rank of every node), per the
    daemons' own status endpoint: one per engine rank that mapped the weights."""
    total = 0
    for pod in pods(kube, namespace, DAEMONS):
        report = http_json(f"http://{pod['status']['podIP']}:9400/status", timeout=10)
        total += sum(rank["maps_served"] for rank in report["ranks"])
    return total
