"""What the CPU examples need from a cluster of process-kubelet nodes, and how to read what they
run: shared by the demo, the e2e tests and the CPU benchmarks.

examples/weightcache-cpu.yaml (the sample, the default everywhere here) serves a tiny Llama to the
reference engine; examples/weightcache-vllm-cpu.yaml (``VLLM_SAMPLE``) a tiny Qwen3 to vLLM, and
examples/weightcache-sglang-cpu.yaml (``SGLANG_SAMPLE``) the same tiny Qwen3 to SGLang. Each
selects nodes by a label and loads its checkpoint from a hostPath; on the process kubelet a node's
"/" is a directory (``node_root``), so the checkpoint is generated once and copied to that path
under every node's root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .binaries import CLUSTER_SOURCES
from .rest import Kube
from .waiting import wait_for

REPO = CLUSTER_SOURCES.parent.parent
SAMPLE = REPO / "examples" / "weightcache-cpu.yaml"
VLLM_SAMPLE = REPO / "examples" / "weightcache-vllm-cpu.yaml"
SGLANG_SAMPLE = REPO / "examples" / "weightcache-sglang-cpu.yaml"
# A tiny Qwen3 whose head size (256 / 4 = 64) vLLM's CPU attention kernels support, in the
# examples' dtype.
TINY_QWEN3 = [
    *("--family", "qwen3", "--hidden-size", "256", "--intermediate-size", "512"),
    *("--heads", "4", "--kv-heads", "2", "--dtype", "bfloat16"),
]
CHECKPOINT_ARGS: dict[Path, list[str]] = {
    SAMPLE: [],  # `weightcache gen-checkpoint`'s default: a tiny Llama
    VLLM_SAMPLE: TINY_QWEN3,
    SGLANG_SAMPLE: TINY_QWEN3,
}
"""How ``weightcache gen-checkpoint`` makes each example's checkpoint."""
CHART = REPO / "charts" / "weightcache"
NAME = "tiny-llama"


def engines_of(name: str) -> str:
    """The label selector of a WeightCache's engine pods."""
    return f"weightcache.io/cache={name},weightcache.io/component=engine"


def daemons_of(name: str) -> str:
    """The label selector of a WeightCache's daemon pods."""
    return f"weightcache.io/cache={name},weightcache.io/component=daemon"


ENGINES = engines_of(NAME)
DAEMONS = daemons_of(NAME)


def sample(example: Path = SAMPLE) -> dict[str, Any]:
    """An example (the CPU sample unless named) as a dict, to change before applying."""
    return dict(yaml.safe_load(example.read_text()))


def node_labels(example: Path = SAMPLE) -> dict[str, str]:
    """The labels the example's nodes must carry (its spec.placement.nodeSelector)."""
    return dict(sample(example)["spec"]["placement"]["nodeSelector"])


def checkpoint_path(example: Path = SAMPLE) -> str:
    """Where on a node the example reads its checkpoint (spec.model.source.hostPath.path)."""
    return str(sample(example)["spec"]["model"]["source"]["hostPath"]["path"])


def generate_checkpoint(target: Path, example: Path = SAMPLE, log: Path | None = None) -> Path:
    """The example's checkpoint (seeded random weights, so the same every time) written to
    ``target``; what the generator prints goes to ``log`` if given."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO / "contract"), str(REPO / "daemon_image"), *filter(None, [os.environ.get("PYTHONPATH")])]
        ),
    }
    command = [sys.executable, "-m", "weightcache", "gen-checkpoint", str(target), *CHECKPOINT_ARGS[example]]
    if log is None:
        subprocess.run(command, check=True, capture_output=True, env=environment)
    else:
        with open(log, "w") as sink:
            subprocess.run(command, check=True, stdout=sink, stderr=subprocess.STDOUT, env=environment)
    return target


def place_checkpoint(made: Path, node_roots: Iterable[Path], example: Path = SAMPLE) -> list[Path]:
    """Copies a generated checkpoint to the example's hostPath under each node root (replacing
    what was there); returns the copies."""
    copies = []
    for root in node_roots:
        target = root / checkpoint_path(example).lstrip("/")
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(made, target)
        copies.append(target)
    return copies


def converged(status: dict[str, Any]) -> bool:
    """A WeightCache status that says the cache serves (phase ``Ready``) with every daemon and every
    active and standby engine Ready (``DaemonsReady`` and ``EnginesReady`` True): what a scenario
    waits for before it breaks something. The phase alone says only that the cache serves."""
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    return (
        status.get("phase") == "Ready"
        and conditions.get("DaemonsReady") == "True"
        and conditions.get("EnginesReady") == "True"
    )


def pods(kube: Kube, namespace: str, selector: str) -> list[dict[str, Any]]:
    return list(kube.get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"])


def events(
    kube: Kube, namespace: str, reason: str, at_least: int = 1, of: str = NAME, timeout: float = 30
) -> list[dict[str, Any]]:
    """The namespace's Events of ``reason`` about the cache ``of``, once at least ``at_least`` of
    them (counting each Event's ``count``) have arrived: the operator sends Events off its passes
    (weightcache_operator/events.py), so one can land a moment after the status that tells of it."""

    def found() -> list[dict[str, Any]]:
        return [
            e
            for e in kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
            if e.get("reason") == reason and e["involvedObject"]["name"] == of
        ]

    wait_for(
        lambda: sum(e.get("count", 1) for e in found()) >= at_least,
        timeout,
        describe=lambda: f"{reason} Events about {of}: {[e.get('message') for e in found()]}, want {at_least}",
    )
    return found()


def daemon_facts(kube: Kube, namespace: str, daemons: str = DAEMONS) -> dict[str, tuple[str, int, int]]:
    """Daemon pod (``daemons``: their label selector) → (uid, container restarts, checkpoint bytes
    its ranks read, per the daemon's own status endpoint)."""
    facts = {}
    for pod in pods(kube, namespace, daemons):
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9400/status", timeout=10) as response:
            report = json.loads(response.read())
        restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))
        facts[pod["metadata"]["name"]] = (
            pod["metadata"]["uid"],
            restarts,
            sum(r["disk_bytes_read"] or 0 for r in report["ranks"]),
        )
    return facts


def container_pid(pod: dict[str, Any], container: str) -> int:
    """The process (and process group) the process kubelet runs a container as, from the
    ``process://<pid>`` container ID it reports in the pod's status."""
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] == container and "running" in status.get("state", {}):
            return int(status["containerID"].removeprefix("process://"))
    raise LookupError(f"pod {pod['metadata']['name']} has no running container {container!r}")


PROMPT_IDS = [1, 17, 300, 42, 9]
COMPLETION_TOKENS = 8


def completion_by_ids(model: str) -> dict[str, Any]:
    """The greedy completion of PROMPT_IDS asked of an engine's /v1/completions for the model name
    it serves, with its token ids in the answer (vLLM and SGLang both take ``return_token_ids``):
    token ids, not text, so the comparison with the engine from disk does not depend on the
    tokenizer."""
    return {
        "model": model,
        "prompt": PROMPT_IDS,
        "max_tokens": COMPLETION_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def parsed_sample(example: Path) -> Any:
    """The example as the operator's validated ``WeightCache``."""
    from weightcache_operator.observe.validation import parse

    body = sample(example)
    body["metadata"].update(namespace="default", uid="sample", generation=1)
    cache, problems = parse(body)
    if cache is None or problems:
        raise ValueError(f"{example} does not validate: {problems}")
    return cache


def rendered_vllm_args(example: Path = VLLM_SAMPLE) -> list[str]:
    """The vLLM arguments the operator renders for a vLLM example, daemons and engines alike."""
    from weightcache_operator.profiles.vllm import vllm_args

    return vllm_args(parsed_sample(example))


def vllm_disk_token_ids(checkpoint: Path, example: Path = VLLM_SAMPLE, log: Path | None = None) -> list[int]:
    """vLLM's greedy ids for PROMPT_IDS with its default loader (``--load-format auto``) on
    ``checkpoint`` and the vLLM arguments the example's engines get (a small KV cache: engine-only),
    in a process of its own (tests/vllm_engine/engine_process.py) that logs to ``log`` if given
    (else to this process's stderr)."""
    sys.path.insert(0, str(REPO / "tests" / "vllm_engine"))
    from vllm_harness import Engine

    args = [*rendered_vllm_args(example), "--kv-cache-memory-bytes", str(64 * 2**20)]
    with Engine(checkpoint, args, log=log) as engine:
        modes = [r["mode"] for r in engine.report()]
        if modes != ["disk"]:
            raise RuntimeError(f"the reference engine was to load from disk, it reports {modes}")
        [ids] = engine.generate([PROMPT_IDS], COMPLETION_TOKENS)
    return list(ids)


def sglang_disk_token_ids(checkpoint: Path, example: Path = SGLANG_SAMPLE, log: Path | None = None) -> list[int]:
    """SGLang's greedy ids for PROMPT_IDS with its default loader on ``checkpoint`` and the SGLang
    arguments the example's engines get (``python -m sglang.launch_server`` in a process of its
    own, tests/sglang_engine/sglang_harness.py), logging to ``log`` (else to a temporary file)."""
    import tempfile

    from weightcache_operator.profiles.sglang import sglang_args

    sys.path.insert(0, str(REPO / "tests" / "sglang_engine"))
    from sglang_harness import Server

    cache = parsed_sample(example)
    args = [*sglang_args(cache), "--max-total-tokens", str(cache.spec.engine.sglang.max_total_tokens)]
    with tempfile.TemporaryDirectory(prefix="wc-sglang-disk-") as scratch:
        server = Server(checkpoint, args, log=log or Path(scratch) / "sglang.log", calls=Path(scratch) / "calls")
        try:
            server.wait_healthy()
            [ids] = server.generate([PROMPT_IDS], COMPLETION_TOKENS)
        finally:
            server.stop()
        if (Path(scratch) / "calls").exists():
            raise RuntimeError(f"SGLang from disk called the kernel stand-in: {(Path(scratch) / 'calls').read_text()}")
    return list(ids)
