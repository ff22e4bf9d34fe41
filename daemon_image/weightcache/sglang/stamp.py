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

from ..checkpoints.checkpoint import open_checkpoint
from ..checkpoints.manifest import LAYOUT_VERSION
from ..engine_profiles.stamp import cpu_isa, sha256_of
from ..wire.fingerprint import EngineStamp, Fingerprint, ShardStamp, environment_stamp

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
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.platforms import current_platform

    cfg = resolving_view(server_args)
    checkpoint = open_checkpoint(cfg.model_path, stamps_only=True)
    hf_config = model_config.hf_config
    quant_config = getattr(hf_config, "quantization_config", None)
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
    return Fingerprint(
        model_path=str(checkpoint.path),
        revision=cfg.revision or "",
        config_sha256=checkpoint.config_sha256,
        shards=tuple(ShardStamp(**vars(s)) for s in checkpoint.shards),
        tp_size=cfg.tp_size,
        tp_rank=tp_rank,
        pp_size=cfg.pp_size,
        pp_rank=pp_rank,
        ep_size=1,  # SGLang's expert placement is in settings (ep_size, moe_a2a_backend, eplb)
        quantization=str(model_config.quantization or "none"),
        quantization_sha256=sha256_of(quant_config),
        dtype=str(model_config.dtype).removeprefix("torch."),
        layout_version=LAYOUT_VERSION,
        environment=environment_stamp(backend, device),
        engine=EngineStamp(engine="sglang", version=sglang.__version__, load_profile=SGLANG_PROFILE, settings=settings),
    )
