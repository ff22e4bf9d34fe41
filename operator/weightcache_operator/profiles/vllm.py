"""The vLLM profile (``spec.engine.vllm``): daemons load with vLLM's own loader (the data plane's
``vllm`` load profile) and engines run ``vllm serve --load-format weightcache`` with a rendered
command, environment and probes on vLLM's ``/health``.

The vLLM arguments are built once (``vllm_args``) and rendered into both the daemon and the engine
command: the daemon computes the arena's fingerprint from its vLLM configuration, the engine's
loader from its own, and any argument one side lacks would make every engine fall back to disk
(or fail) with ``differs in: engine.settings.<field>``.
"""

from __future__ import annotations

import json
from typing import Any

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import ENGINE_IMAGE_ENV, LOAD_FORMAT, VLLM_PROFILE, VLLM_REPLAY_KERNEL_ENV

from weightcache_operator.profiles.base import (
    EngineProfile,
    artifacts_run,
    own_command_problems,
    reserved_flag_problems,
)
from weightcache_operator.spec import ENGINE_DRAIN_S, WeightCache
from weightcache_operator.vocabulary import ARTIFACT_MOUNT, MODEL_MOUNT, SOCKET_MOUNT, CacheRef, served_model_name

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


def kernel_env(cache: WeightCache) -> dict[str, str]:
    """On GPUs, the kernel choice under which vLLM 0.26 can serve block FP8 from the cache
    (``VLLM_REPLAY_KERNEL_ENV``), for the daemons and the engines alike: the fingerprint carries it,
    so a side without it would never share the arena. Set whatever the checkpoint holds: vLLM takes
    the quantization from config.json even where spec.model.quantization says none, and it changes
    only FP8 kernels."""
    return dict(VLLM_REPLAY_KERNEL_ENV) if cache.spec.daemon.backend in GPU_BACKENDS else {}


def loader_config(cache: WeightCache) -> dict[str, str]:
    """``--model-loader-extra-config`` of the weightcache loader: where the daemon's sockets are,
    which cache, and what to do when the arena cannot be used."""
    return {
        "socket_dir": SOCKET_MOUNT,
        "name": CacheRef.of(cache).name,
        "fallback": cache.spec.engine.weight_fallback,
    }


class VllmProfile(EngineProfile):
    name = "vllm"
    load_profile = VLLM_PROFILE
    field = "vllm"

    def problems(self, cache: WeightCache) -> list[str]:
        """What a cache with ``spec.engine.vllm`` cannot have: the reference engine's options vLLM has
        no counterpart for, and settings the operator renders into vLLM's command itself."""
        spec = cache.spec
        vllm = spec.engine.vllm
        assert vllm is not None
        found: list[str] = []
        parallelism = spec.parallelism
        if parallelism.nodes > 1:
            found.append(
                f"spec.parallelism.nodes is {parallelism.nodes}, but vLLM engines run on one node here; set nodes to 1 "
                "(tensor × pipeline GPUs on each node), or leave spec.engine.vllm unset for the reference engine"
            )
        if parallelism.expert not in (1, parallelism.tensor):
            found.append(
                f"spec.parallelism.expert is {parallelism.expert}, but vLLM's expert parallelism (--enable-expert-parallel)"
                f" spans every tensor-parallel rank; set expert to 1 (experts split across ranks) or to tensor"
                f" ({parallelism.tensor}, whole experts per rank)"
            )
        if spec.daemon.backend in GPU_BACKENDS and vllm.kv_cache_space_gib is not None:
            found.append(
                "spec.engine.vllm.kvCacheSpaceGiB sizes CPU engines only (daemon.backend cpu-shm); on GPUs remove it and "
                "size the KV cache with --gpu-memory-utilization in spec.engine.vllm.engineArgs"
            )
        if spec.daemon.backend not in GPU_BACKENDS and vllm.kv_cache_space_gib is None:
            found.append(
                "spec.engine.vllm.kvCacheSpaceGiB is required on CPU (daemon.backend cpu-shm): vLLM's automatic sizing "
                "counts the mapped weights as each engine's own memory; set each engine's KV cache in GiB"
            )
        found += own_command_problems(cache, self.selector)
        found += reserved_flag_problems(
            "vllm", {"args": vllm.args, "engineArgs": vllm.engine_args}, RENDERED_FLAGS, SHARED_FLAGS, name=flag_name
        )
        return found

    def daemon_args(self, cache: WeightCache) -> dict[str, Any]:
        """The shared vLLM arguments (dtype, quantization, revision and expert parallelism among
        them: the daemon refuses the reference loader's flags for those); with ``artifactCache``
        the directory whose engines' compile artifacts it publishes."""
        fields: dict[str, Any] = {"engine_args": tuple(vllm_args(cache))}
        artifacts = cache.spec.engine.vllm.artifact_cache if cache.spec.engine.vllm is not None else None
        if artifacts is not None:
            fields |= {"artifact_dir": ARTIFACT_MOUNT, "artifact_max_bytes": artifacts.max_bytes}
        return fields

    def daemon_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        """The daemon's vLLM loader runs vLLM's model construction; its processes stay on loopback too."""
        values = {"VLLM_HOST_IP": "127.0.0.1", **kernel_env(cache)}
        return [{"name": k, "value": v} for k, v in values.items()]

    def daemon_read_only_root(self, cache: WeightCache) -> bool:
        # vLLM's model construction writes its caches and configuration under the home directory.
        return False

    def uses_artifacts(self, cache: WeightCache) -> bool:
        return cache.spec.engine.vllm is not None and cache.spec.engine.vllm.artifact_cache is not None

    def daemon_hash_fields(self, cache: WeightCache) -> dict[str, Any]:
        """The vLLM arguments the daemons load with. The engine-only fields are left out: they roll
        engines only; artifactCache only when set, so that caches without it keep their hash."""
        vllm = cache.spec.engine.vllm
        assert vllm is not None
        unset = {"artifact_cache"} if vllm.artifact_cache is None else set()
        return {
            "vllm": vllm.model_dump(by_alias=True, mode="json", exclude={"engine_args", "kv_cache_space_gib", *unset})
        }

    def engine_hash_exclude(self, cache: WeightCache) -> dict[str, Any]:
        # Caches without artifactCache keep the hash they had before the field existed.
        vllm = cache.spec.engine.vllm
        return {"vllm": {"artifact_cache"}} if vllm is not None and vllm.artifact_cache is None else {}

    def engine_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        """What a vLLM engine needs from its environment; a variable the template sets itself wins."""
        spec = cache.spec
        assert spec.engine.vllm is not None, "the environment needs spec.engine.vllm"
        # vLLM's processes (API server, engine core, workers) talk over message queues bound to this
        # address; left unset they bind a non-loopback one, which nothing outside the pod needs.
        values = {"VLLM_HOST_IP": "127.0.0.1", **kernel_env(cache)}
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
            values[ENGINE_IMAGE_ENV] = str(spec.engine.template.spec.containers[0].get("image", ""))
        return [{"name": k, "value": v} for k, v in values.items()]

    def engine_command(self, cache: WeightCache) -> list[str]:
        """``vllm serve …``; with ``artifactCache`` run by ``weightcache artifacts-run``, which stages
        the engine's compile caches on the node and marks them for publication once ``/health`` answers.
        Validation refuses a template whose first container sets its own command or args."""
        spec = cache.spec
        assert spec.engine.vllm is not None, "the command needs spec.engine.vllm"
        wrapper: list[str] = []
        if spec.engine.vllm.artifact_cache is not None:
            wrapper = artifacts_run(self.load_profile, f"http://$(POD_IP):{spec.engine.port}{HEALTH_PATH}")
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

    def engine_probes(self, cache: WeightCache) -> dict[str, dict[str, Any]]:
        """Probes on vLLM's ``/health``. The startup probe covers loading (a disk fallback of a large
        model takes minutes); liveness restarts an engine whose engine core died (503) or hangs;
        readiness takes it out of the Service within two seconds, as for the reference engine."""
        port = cache.spec.engine.port

        def health(**timing: int) -> dict[str, Any]:
            return {"httpGet": {"path": HEALTH_PATH, "port": port}, **timing}

        return {
            "startupProbe": health(periodSeconds=2, failureThreshold=900),
            "readinessProbe": health(periodSeconds=1, failureThreshold=2),
            "livenessProbe": health(periodSeconds=10, timeoutSeconds=5, failureThreshold=3),
        }
