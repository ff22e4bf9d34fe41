"""The fingerprint of an ``sglang``-profile arena, from SGLang's own view of the model and the rank.

The publisher and the engine's loader both compute it from the resolved ``ServerArgs`` and the
``ModelConfig`` they run with, before any weight is loaded (post-processing may rewrite the
config's quantization section). Checkpoint identity and the parallel layout use the reference
profile's fields; what SGLang's loading and post-processing depend on beyond them — the fields of
SGLang's own weight-cache ``CacheConfig`` and more — goes into ``Fingerprint.engine``.
"""

from __future__ import annotations

from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import SGLANG_PROFILE

from ..engine_profiles.stamp import cpu_isa, engine_fingerprint, sha256_of
from ..wire.fingerprint import EngineStamp, Fingerprint
from .server_args import resolved

SETTINGS = (
    # The class SGLang builds (--model-impl transformers swaps it for another under one config.json).
    "model_impl",
    "trust_remote_code",
    "kv_cache_dtype",
    # Expert placement and the MoE kernels post-processing prepares the weights for.
    "ep_size",
    "moe_dp_size",
    "moe_a2a_backend",
    "moe_runner_backend",
    "moe_dense_tp_size",
    "enable_eplb",
    "ep_num_redundant_experts",
    "disable_shared_experts_fusion",
    "enable_dp_lm_head",
    "attn_cp_size",
    "fp8_gemm_runner_backend",
    "enable_fp32_lm_head",
    "is_embedding",
)
"""Resolved ``ServerArgs`` fields that change which tensors a rank holds or their bytes."""


def platform_backend() -> str:
    """The arena backend of SGLang's platform: where its kernels read the weights from."""
    from sglang.srt.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu-shm"
    if current_platform.is_cuda():
        return "cuda-vmm"
    raise WeightCacheError(
        f"weightcache has no arena for SGLang's {current_platform.device_type} platform (cpu-shm on CPU, "
        "cuda-vmm on NVIDIA GPUs)"
    )


def rank_fingerprint(
    server_args: Any, model_config: Any, tp_rank: int, pp_rank: int, backend: str = "cpu-shm", device: int = 0
) -> Fingerprint:
    """``device``: the CUDA ordinal whose GPU the arena is on (GPU backends)."""
    import sglang
    from sglang.srt.platforms import current_platform

    cfg = resolved(server_args)
    hf_config = model_config.hf_config
    settings = {name: str(getattr(cfg, name)) for name in SETTINGS}
    settings.update(
        {
            "platform": str(current_platform.device_type),
            "architecture": ",".join(getattr(hf_config, "architectures", None) or []),
            "hf_config_sha256": sha256_of(hf_config.to_dict()),  # config.json as SGLang's runner adjusted it
            "json_model_override_args_sha256": sha256_of({"value": cfg.json_model_override_args}),
            # The engine's weightcache format is its disk fallback's (auto); the daemon refuses others.
            "load_format": "auto",
            "quantization": str(model_config.quantization),
        }
    )
    if backend == "cpu-shm":
        settings["cpu_isa"] = cpu_isa()
    stamp = EngineStamp(engine="sglang", version=sglang.__version__, load_profile=SGLANG_PROFILE, settings=settings)
    return engine_fingerprint(
        cfg.model_path,
        revision=cfg.revision,
        tp=(cfg.tp_size, tp_rank),
        pp=(cfg.pp_size, pp_rank),
        model_config=model_config,
        backend=backend,
        device=device,
        engine=stamp,
    )
