"""The SGLang profile (``spec.engine.sglang``): daemons load with SGLang's own loader (the data
plane's ``sglang`` load profile) and engines run ``sglang serve --load-format weightcache`` with a
rendered command, environment and probes on SGLang's ``/health``.

The SGLang arguments are built once (``sglang_args``) and rendered into both the daemon and the
engine command: the daemon computes the arena's fingerprint from its resolved ``ServerArgs``, the
engine's loader from its own, and any argument one side lacks would make every engine fall back to
disk (or fail) with ``differs in: engine.settings.<field>``.
"""

from __future__ import annotations

import json
from typing import Any

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import LOAD_FORMAT, SGLANG_PROFILE

from weightcache_operator.profiles.base import EngineProfile, own_command_problems, reserved_flag_problems
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import MODEL_MOUNT, SOCKET_MOUNT, CacheRef, served_model_name

SGLANG_CLI = ["sglang", "serve"]
"""SGLang's console script (``sglang serve`` loads the plug-ins as ``launch_server`` does)."""
HEALTH_PATH = "/health"
GENERATE_HEALTH_PATH = "/health_generate"
CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
"""SGLang's CPU engine: without it SGLang takes the CPU for a CUDA-like platform."""
ENGINE_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "false"}
"""SGLang's ``/health`` otherwise generates a token and sleeps a second before it answers, longer
than a readiness probe's second: readiness would flap under load and a standby be promoted over a
healthy active. With it ``/health`` answers at once (503 while starting or shutting down), and the
liveness probe asks ``/health_generate``, which still generates."""
SGLANG_HEALTH_CHECK_TIMEOUT_S = 20
"""How long SGLang's ``/health_generate`` waits for its token before it answers 503
(``SGLANG_HEALTH_CHECK_TIMEOUT``'s default)."""

RENDERED_FLAGS: dict[str, str] = {
    "--model-path": "spec.model.source (the checkpoint is mounted and passed as the model path)",
    "--model": "spec.model.source (the checkpoint is mounted and passed as the model path)",
    "--dtype": "spec.model.dtype",
    "--tp-size": "spec.parallelism.tensor",
    "--tensor-parallel-size": "spec.parallelism.tensor",
    "--tp": "spec.parallelism.tensor",
    "--pp-size": "spec.parallelism.pipeline",
    "--pipeline-parallel-size": "spec.parallelism.pipeline",
    "--quantization": "spec.model.quantization.method",
    "--revision": "spec.model.revision",
    "--context-length": "spec.engine.sglang.contextLength",
    "--max-total-tokens": "spec.engine.sglang.maxTotalTokens",
    "--device": "spec.daemon.backend (cpu-shm: --device cpu)",
    "--served-model-name": "spec.engine.servedModelName",
    "--load-format": "nothing: the operator loads through the weightcache plug-in",
    "--model-loader-extra-config": "spec.engine.weightFallback (the rest comes from the cache)",
    "--host": "nothing: engines bind their pod IP",
    "--port": "spec.engine.port",
    "--dp-size": "spec.engine.replicas (one engine per replica; data parallelism is not supported)",
    "--data-parallel-size": "spec.engine.replicas (one engine per replica; data parallelism is not supported)",
    "--nnodes": "nothing: SGLang engines run on one node (spec.parallelism.nodes 1)",
    "--node-rank": "nothing: SGLang engines run on one node (spec.parallelism.nodes 1)",
    "--weight-cache-mode": "nothing: SGLang's own weight cache daemon is replaced by the operator's",
}
"""Flags the operator renders itself, and the spec field that sets each instead."""
SHARED_FLAGS = ("--kv-cache-dtype", "--json-model-override-args", "--model-impl", "--trust-remote-code")
"""Flags that enter the SGLang profile's fingerprint, so they belong in ``args`` (daemons too)."""


def sglang_args(cache: WeightCache) -> list[str]:
    """The one list of SGLang arguments that daemon and engine share (see the module docstring)."""
    spec = cache.spec
    assert spec.engine.sglang is not None, "sglang_args needs spec.engine.sglang"
    args = ["--dtype", spec.model.dtype, "--tp-size", str(spec.parallelism.tensor)]
    args += ["--pp-size", str(spec.parallelism.pipeline)]
    if spec.daemon.backend not in GPU_BACKENDS:
        args += ["--device", "cpu"]
    if spec.model.quantization.method == "fp8":
        args += ["--quantization", "fp8"]
    if spec.model.revision:
        args += ["--revision", spec.model.revision]
    if spec.engine.sglang.context_length is not None:
        args += ["--context-length", str(spec.engine.sglang.context_length)]
    return [*args, *spec.engine.sglang.args]


class SglangProfile(EngineProfile):
    name = "sglang"
    load_profile = SGLANG_PROFILE
    field = "sglang"

    def problems(self, cache: WeightCache) -> list[str]:
        spec = cache.spec
        sglang = spec.engine.sglang
        assert sglang is not None
        found: list[str] = []
        if spec.parallelism.nodes > 1:
            found.append(
                f"spec.parallelism.nodes is {spec.parallelism.nodes}, but SGLang engines run on one node here; set "
                "nodes to 1, or leave spec.engine.sglang unset for the reference engine"
            )
        if spec.parallelism.expert != 1:
            found.append(
                f"spec.parallelism.expert is {spec.parallelism.expert}, but the sglang profile does not serve expert "
                "parallelism yet; set expert to 1 (experts split across tensor-parallel ranks)"
            )
        on_cpu = spec.daemon.backend not in GPU_BACKENDS
        if on_cpu and sglang.max_total_tokens is None:
            found.append(
                "spec.engine.sglang.maxTotalTokens is required on CPU (daemon.backend cpu-shm): SGLang's automatic "
                "sizing gives most of the node's free memory to one engine's KV cache; set each engine's in tokens"
            )
        if not on_cpu and sglang.max_total_tokens is not None:
            found.append(
                "spec.engine.sglang.maxTotalTokens sizes CPU engines only (daemon.backend cpu-shm); on GPUs remove "
                "it and size the KV cache with --mem-fraction-static in spec.engine.sglang.engineArgs"
            )
        found += own_command_problems(cache, self.selector)
        found += reserved_flag_problems(
            "sglang", {"args": sglang.args, "engineArgs": sglang.engine_args}, RENDERED_FLAGS, SHARED_FLAGS
        )
        return found

    def daemon_args(self, cache: WeightCache) -> dict[str, Any]:
        return {"engine_args": tuple(sglang_args(cache))}

    def daemon_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        on_cpu = cache.spec.daemon.backend not in GPU_BACKENDS
        return [{"name": k, "value": v} for k, v in CPU_ENV.items()] if on_cpu else []

    def daemon_read_only_root(self, cache: WeightCache) -> bool:
        # SGLang's model construction writes its caches and configuration under the home directory.
        return False

    def daemon_hash_fields(self, cache: WeightCache) -> dict[str, Any]:
        """The SGLang arguments the daemons load with; the engine-only fields roll engines only."""
        sglang = cache.spec.engine.sglang
        assert sglang is not None
        return {"sglang": sglang.model_dump(by_alias=True, mode="json", exclude={"engine_args", "max_total_tokens"})}

    def engine_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        return [*self.daemon_env(cache), *({"name": k, "value": v} for k, v in ENGINE_ENV.items())]

    def engine_command(self, cache: WeightCache) -> list[str]:
        spec = cache.spec
        sglang = spec.engine.sglang
        assert sglang is not None, "the command needs spec.engine.sglang"
        loader = {"socket_dir": SOCKET_MOUNT, "name": CacheRef.of(cache).name, "fallback": spec.engine.weight_fallback}
        tokens = ["--max-total-tokens", str(sglang.max_total_tokens)] if sglang.max_total_tokens is not None else []
        return [
            *SGLANG_CLI,
            "--model-path",
            MODEL_MOUNT,
            *sglang_args(cache),
            *tokens,
            "--served-model-name",
            served_model_name(cache),
            *sglang.engine_args,
            "--load-format",
            LOAD_FORMAT,
            "--model-loader-extra-config",
            json.dumps(loader, sort_keys=True),
            "--host",
            "$(POD_IP)",
            "--port",
            str(spec.engine.port),
        ]

    def engine_probes(self, cache: WeightCache) -> dict[str, dict[str, Any]]:
        """Startup and readiness on SGLang's ``/health`` (at once: ``ENGINE_ENV``), so a serving
        engine leaves the Service within two seconds of its shutdown; liveness on
        ``/health_generate``, which restarts an engine whose scheduler no longer generates."""
        port = cache.spec.engine.port

        def probe(path: str, **timing: int) -> dict[str, Any]:
            return {"httpGet": {"path": path, "port": port}, **timing}

        return {
            "startupProbe": probe(HEALTH_PATH, periodSeconds=2, failureThreshold=900),
            "readinessProbe": probe(HEALTH_PATH, periodSeconds=1, failureThreshold=2),
            "livenessProbe": probe(
                GENERATE_HEALTH_PATH,
                periodSeconds=10,
                timeoutSeconds=SGLANG_HEALTH_CHECK_TIMEOUT_S + 5,
                failureThreshold=3,
            ),
        }
