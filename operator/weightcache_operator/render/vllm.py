"""What a cache with ``spec.engine.vllm`` renders differently: the daemons' ``vllm`` profile and
the engines' ``vllm serve`` command, environment and probes.

The vLLM arguments are built once (``vllm_args``) and rendered into both the daemon and the engine
command: the daemon computes the arena's fingerprint from its vLLM configuration, the engine's
loader from its own, and any argument one side lacks would make every engine fall back to disk
(or fail) with ``differs in: engine.settings.<field>``.
"""

from __future__ import annotations

import json
from typing import Any

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import LOAD_FORMAT, VLLM_PROFILE, engine_env_name

from ..spec import ENGINE_DRAIN_S, WeightCache
from .layout import ARTIFACT_MOUNT, CLI, MODEL_MOUNT, SOCKET_MOUNT, CacheRef, served_model_name

VLLM_CLI = ["vllm"]
"""vLLM's console script: on PATH in vLLM's images and in any environment vLLM is installed in
(the e2e cluster's process kubelet puts the test interpreter's bin directory first)."""
HEALTH_PATH = "/health"
"""vLLM's OpenAI server: 200 once the engine serves, 503 once its engine core is dead."""

RENDERED_FLAGS: dict[str, str] = {
    "--model": "spec.model.source (the checkpoint is mounted and passed as vllm serve's model path)",
    "--dtype": "spec.model.dtype",
    "--tensor-parallel-size": "spec.parallelism.tensor",
    "-tp": "spec.parallelism.tensor",
    "--pipeline-parallel-size": "spec.parallelism.pipeline",
    "-pp": "spec.parallelism.pipeline",
    "--enable-expert-parallel": "spec.parallelism.expert (equal to tensor)",
    "--no-enable-expert-parallel": "spec.parallelism.expert (1)",
    "-ep": "spec.parallelism.expert (equal to tensor)",
    "--quantization": "spec.model.quantization.method",
    "-q": "spec.model.quantization.method",
    "--revision": "spec.model.revision",
    "--max-model-len": "spec.engine.vllm.maxModelLen",
    "--served-model-name": "spec.engine.servedModelName",
    "--load-format": "nothing: the operator loads through the weightcache plug-in",
    "--model-loader-extra-config": "spec.engine.weightFallback (the rest comes from the cache)",
    "--host": "nothing: engines bind their pod IP",
    "--port": "spec.engine.port",
    "--data-parallel-size": "spec.engine.replicas (one engine per replica; data parallelism is not supported)",
    "-dp": "spec.engine.replicas (one engine per replica; data parallelism is not supported)",
    "--nnodes": "nothing: vLLM engines run on one node (spec.parallelism.nodes 1)",
    "-n": "nothing: vLLM engines run on one node (spec.parallelism.nodes 1)",
    "--node-rank": "nothing: vLLM engines run on one node (spec.parallelism.nodes 1)",
    "-r": "nothing: vLLM engines run on one node (spec.parallelism.nodes 1)",
}
"""Flags the operator renders itself, and the spec field that sets each instead."""
SHARED_FLAGS = ("--kv-cache-dtype", "--hf-overrides", "--hf-config-path")
"""Flags that enter the vLLM profile's fingerprint (what vLLM's post-processing depends on), so
they belong in ``args``, which the daemons get too, never in ``engineArgs`` alone."""


def uses_vllm(cache: WeightCache) -> bool:
    return cache.spec.engine.vllm is not None


def flag_name(token: str) -> str:
    """``--max_model_len=4096`` → ``--max-model-len``: vLLM's parser takes underscores for dashes
    and ``=`` values, so a reserved flag is recognised however it is written."""
    name = token.split("=", 1)[0]
    return name[:2] + name[2:].replace("_", "-") if name.startswith("--") else name


def vllm_args(cache: WeightCache) -> list[str]:
    """The one list of vLLM arguments that daemon and engine share (see the module docstring)."""
    spec = cache.spec
    assert spec.engine.vllm is not None, "vllm_args needs spec.engine.vllm"
    parallelism = spec.parallelism
    args = [
        "--dtype",
        spec.model.dtype,
        "--tensor-parallel-size",
        str(parallelism.tensor),
        "--pipeline-parallel-size",
        str(parallelism.pipeline),
    ]
    if parallelism.expert > 1:  # validation allows only expert == tensor: vLLM's EP spans all TP ranks
        args.append("--enable-expert-parallel")
    if spec.model.quantization.method == "fp8":
        # Named so that a spec asking for FP8 never serves an unquantized checkpoint as it is: vLLM
        # checks the method against config.json (a block-FP8 checkpoint matches; its block size
        # comes from there), and on an unquantized one would quantize online, which the plug-in
        # refuses by name.
        args += ["--quantization", "fp8"]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.engine.vllm.max_model_len is not None:
        args += ["--max-model-len", str(spec.engine.vllm.max_model_len)]
    return [*args, *spec.engine.vllm.args]


def uses_artifacts(cache: WeightCache) -> bool:
    return cache.spec.engine.vllm is not None and cache.spec.engine.vllm.artifact_cache is not None


def daemon_profile_fields(cache: WeightCache) -> dict[str, Any]:
    """The daemon's ``DaemonArgs`` fields of a vLLM cache: its load profile and the shared vLLM
    arguments; with ``artifactCache`` the directory whose engines' compile artifacts it publishes."""
    fields: dict[str, Any] = {"profile": VLLM_PROFILE, "vllm_args": tuple(vllm_args(cache))}
    artifacts = cache.spec.engine.vllm.artifact_cache if cache.spec.engine.vllm is not None else None
    if artifacts is not None:
        fields |= {"artifact_dir": ARTIFACT_MOUNT, "artifact_max_bytes": artifacts.max_bytes}
    return fields


ARTIFACT_VOLUME = "weightcache-artifacts"


def daemon_artifact_volume(cache: WeightCache) -> tuple[dict[str, Any], dict[str, Any]]:
    """The daemon pod owns the node's artifact directory (owner_init hands it to the daemon's uid)."""
    volume = {
        "name": ARTIFACT_VOLUME,
        "hostPath": {"path": CacheRef.of(cache).artifact_host_dir, "type": "DirectoryOrCreate"},
    }
    return volume, {"name": ARTIFACT_VOLUME, "mountPath": ARTIFACT_MOUNT}


def engine_artifact_volumes(cache: WeightCache) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """An engine sees the published entries read-only (the kernel refuses its writes there, so no
    engine can change what another starts from) and writes only under ``staging/``, where its
    wrapper makes a private directory. ``Directory``, not ``DirectoryOrCreate``: the daemon creates
    both (a kubelet-created one would be root's, unwritable for the engine), and engines start only
    where the daemon is ready."""
    host = CacheRef.of(cache).artifact_host_dir
    return [
        (
            {"name": f"{ARTIFACT_VOLUME}-{part}", "hostPath": {"path": f"{host}/{part}", "type": "Directory"}},
            {"name": f"{ARTIFACT_VOLUME}-{part}", "mountPath": f"{ARTIFACT_MOUNT}/{part}", "readOnly": read_only},
        )
        for part, read_only in (("entries", True), ("staging", False))
    ]


def loader_config(cache: WeightCache) -> dict[str, str]:
    """``--model-loader-extra-config`` of the weightcache loader: where the daemon's sockets are,
    which cache, and what to do when the arena cannot be used."""
    return {
        "socket_dir": SOCKET_MOUNT,
        "name": CacheRef.of(cache).name,
        "fallback": cache.spec.engine.weight_fallback,
    }


def engine_command(cache: WeightCache) -> list[str]:
    """``vllm serve …``; with ``artifactCache`` run by ``weightcache artifacts-run``, which stages
    the engine's compile caches on the node and marks them for publication once ``/health`` answers."""
    spec = cache.spec
    assert spec.engine.vllm is not None, "engine_command needs spec.engine.vllm"
    wrapper: list[str] = []
    if spec.engine.vllm.artifact_cache is not None:
        health = f"http://$(POD_IP):{spec.engine.port}{HEALTH_PATH}"
        wrapper = [*CLI, "artifacts-run", "--dir", ARTIFACT_MOUNT, "--health", health, "--"]
    return [
        *wrapper,
        *VLLM_CLI,
        "serve",
        MODEL_MOUNT,
        *vllm_args(cache),
        # In-flight requests finish on SIGTERM instead of being aborted (vLLM's default, 0);
        # an --shutdown-timeout in engineArgs comes later and wins.
        "--shutdown-timeout",
        str(ENGINE_DRAIN_S),
        "--served-model-name",
        served_model_name(cache),
        *spec.engine.vllm.engine_args,
        "--load-format",
        LOAD_FORMAT,
        "--model-loader-extra-config",
        json.dumps(loader_config(cache), sort_keys=True),
        # The pod's own IP, like the reference engine: engines of one node share the host's
        # network in some runtimes (the e2e cluster's process kubelet), and an active and a
        # standby on one node listen on the same port.
        "--host",
        "$(POD_IP)",
        "--port",
        str(spec.engine.port),
    ]


def engine_env(cache: WeightCache) -> list[dict[str, Any]]:
    """What a vLLM engine needs from its environment; a variable the template sets itself wins."""
    spec = cache.spec
    assert spec.engine.vllm is not None, "engine_env needs spec.engine.vllm"
    # vLLM's processes (API server, engine core, workers) talk over message queues bound to this
    # address; left unset they bind a non-loopback one, which nothing outside the pod needs.
    values = {"VLLM_HOST_IP": "127.0.0.1"}
    if spec.daemon.backend not in GPU_BACKENDS:
        assert spec.engine.vllm.kv_cache_space_gib is not None, "validation requires kvCacheSpaceGiB on CPU"
        values["VLLM_CPU_KVCACHE_SPACE"] = str(spec.engine.vllm.kv_cache_space_gib)
        # vLLM's automatic binding pins each CPU worker's threads to the cores of a NUMA node of
        # its own and refuses more workers than nodes; it cannot see the other engines of the
        # node, so an active, its standbys and a rollout's new engine would all pin the same
        # cores (a busy active starves a starting engine). The OS schedules the threads instead;
        # a template env can bind them (VLLM_CPU_OMP_THREADS_BIND).
        values["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    if spec.engine.vllm.artifact_cache is not None:
        # Part of the artifacts' key: another image may generate other code for the same configuration.
        values[engine_env_name("image")] = str(spec.engine.template.spec.containers[0].get("image", ""))
    return [{"name": k, "value": v} for k, v in values.items()]


def daemon_env(cache: WeightCache) -> list[dict[str, Any]]:
    """The daemon's vLLM loader runs vLLM's model construction; its processes stay on loopback too."""
    return [{"name": "VLLM_HOST_IP", "value": "127.0.0.1"}]


def engine_probes(port: int) -> dict[str, dict[str, Any]]:
    """Probes on vLLM's ``/health``. The startup probe covers loading (a disk fallback of a large
    model takes minutes); liveness restarts an engine whose engine core died (503) or hangs;
    readiness takes it out of the Service within two seconds, as for the reference engine."""

    def health(**timing: int) -> dict[str, Any]:
        return {"httpGet": {"path": HEALTH_PATH, "port": port}, **timing}

    return {
        "startupProbe": health(periodSeconds=2, failureThreshold=900),
        "readinessProbe": health(periodSeconds=1, failureThreshold=2),
        "livenessProbe": health(periodSeconds=10, timeoutSeconds=5, failureThreshold=3),
    }
