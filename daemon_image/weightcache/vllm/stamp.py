"""The fingerprint of a ``vllm``-profile arena, from vLLM's own view of the model and the rank.

The publisher and the engine's loader both compute it from the ``VllmConfig`` they run with,
before any weight is loaded (vLLM's post-processing may rewrite the config's quantization
section). Checkpoint identity and the parallel layout use the reference profile's fields; what
vLLM's post-processing depends on beyond them goes into ``Fingerprint.engine``.
"""

from __future__ import annotations

from vllm.config import VllmConfig
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import VLLM_PROFILE

from ..engine_profiles.stamp import cpu_isa, engine_fingerprint, sha256_of
from ..wire.fingerprint import EngineStamp, Fingerprint
from .cpu_policy import POLICY
from .engine_args import CHECKPOINT_LOAD_FORMAT, disk_load_format


def platform_backend() -> str:
    """The arena backend of vLLM's platform: where its kernels read the weights from."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "cpu-shm"
    if current_platform.is_cuda():
        return "cuda-vmm"
    raise WeightCacheError(
        f"weightcache has no arena for vLLM's {current_platform.device_type} platform (cpu-shm on CPU, "
        "cuda-vmm on NVIDIA GPUs)"
    )


KERNEL_ENV = (
    "VLLM_USE_DEEP_GEMM",
    "VLLM_MOE_USE_DEEP_GEMM",
    "VLLM_USE_DEEP_GEMM_E8M0",
    "VLLM_USE_DEEP_GEMM_TMA_ALIGNED_SCALES",
    "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
    "VLLM_TEST_FORCE_FP8_MARLIN",
    "VLLM_MARLIN_INPUT_DTYPE",
    "VLLM_DISABLED_KERNELS",
)
"""vLLM's environment variables that choose the kernels a quantized model's post-processing prepares
its weights for: with DeepGEMM, for example, block-FP8 weights are requantised to UE8M0 scales, and
without it CUTLASS and Triton take them as loaded (versions.py). A name a vLLM does not define reads
as None."""


def kernel_env() -> dict[str, str]:
    """``env.<name>`` for each ``KERNEL_ENV`` variable, as vLLM parses it (a mismatch names the
    variable); with whether VLLM_USE_DEEP_GEMM is set at all, which vLLM's FP8 MoE backend choice
    also asks."""
    import vllm.envs as envs

    values = {f"env.{name}": str(getattr(envs, name, None)) for name in KERNEL_ENV}
    values["env.VLLM_USE_DEEP_GEMM.set"] = str(envs.is_set("VLLM_USE_DEEP_GEMM"))
    return values


def rank_fingerprint(
    vllm_config: VllmConfig,
    tp_rank: int,
    pp_rank: int = 0,
    dp_rank: int = 0,
    backend: str = "cpu-shm",
    device: int = 0,
) -> Fingerprint:
    """``device``: the CUDA ordinal whose GPU the arena is on (GPU backends; the environment stamp
    names its kind, compute capability and driver)."""
    import vllm
    from vllm.platforms import current_platform

    model_config = vllm_config.model_config
    parallel = vllm_config.parallel_config
    hf_config = model_config.hf_config
    quant_config = getattr(hf_config, "quantization_config", None)
    load_format = disk_load_format(vllm_config.load_config.load_format, model_config.model)
    multimodal = model_config.multimodal_config
    settings = {
        "platform": current_platform.device_type,
        "architecture": ",".join(getattr(hf_config, "architectures", None) or []),
        # The class vLLM builds: --model-impl transformers swaps Qwen3ForCausalLM for
        # TransformersForCausalLM (other parameter names and fusions) under the same config.json.
        "model_class": str(model_config.architecture),
        # --model-class-overrides registers another class under the same architecture name.
        "model_class_overrides_sha256": sha256_of(model_config.model_class_overrides),
        # --runner pooling / --convert embed|classify wrap the model in an adapter that drops
        # lm_head or adds a score head: other tensors from the same checkpoint.
        "runner": str(model_config.runner_type),
        "convert": str(model_config.convert_type),
        # Remote code (config and, with the Transformers backend, modeling) is Python next to the
        # checkpoint at --code-revision, which the shard and config.json stamps do not cover.
        "trust_remote_code": str(model_config.trust_remote_code),
        "code_revision": str(model_config.code_revision or ""),
        "hf_config_sha256": sha256_of(hf_config.to_dict()),  # config.json after vLLM's overrides
        # Which loader wrote the bytes, as the disk format they come from: the engine's
        # weightcache format is its disk fallback's (auto), so legitimate configs agree, and a
        # daemon made to load dummy (or any other) weights never matches an engine.
        "load_format": load_format,
        "quantization": str(model_config.quantization),
        "quantization_config_sha256": sha256_of(quant_config),
        # --quantization-config: online quantization of layers the checkpoint leaves unquantized.
        "online_quantization_config_sha256": sha256_of(model_config.quantization_config),
        "kv_cache_dtype": str(vllm_config.cache_config.cache_dtype),
        "dp_size": str(parallel.data_parallel_size),
        "dp_rank": str(dp_rank),
        "enable_expert_parallel": str(parallel.enable_expert_parallel),
        # Which experts a rank holds, and how many physical copies EPLB adds.
        "expert_placement_strategy": str(parallel.expert_placement_strategy),
        "enable_eplb": str(parallel.enable_eplb),
        "num_redundant_experts": str(parallel.eplb_config.num_redundant_experts),
        # A multimodal model without its vision tower (--language-model-only) or without its
        # language model (--mm-encoder-only) loads a subset of the checkpoint's tensors.
        "language_model_only": str(multimodal.language_model_only if multimodal else None),
        "mm_encoder_only": str(multimodal.mm_encoder_only if multimodal else None),
        # The kernels post-processing prepares the weights for: e.g. a Marlin or DeepGEMM backend
        # repacks FP8 weights and scales into its own layout (--linear-backend, --moe-backend).
        "linear_backend": str(vllm_config.kernel_config.linear_backend),
        # (--linear-backend-per-quant: vLLM 0.32; an older vLLM has no such setting, and its version is
        # in the stamp, so daemon and engine still compare like with like.)
        "linear_backend_per_quant_sha256": sha256_of(
            getattr(vllm_config.kernel_config, "linear_backend_per_quant", None)
        ),
        "moe_backend": str(vllm_config.kernel_config.moe_backend),
        "cpu_gemm": POLICY if current_platform.is_cpu() else "vllm-default",
    }
    if load_format != CHECKPOINT_LOAD_FORMAT:
        # Formats that do not read the checkpoint (dummy) draw their values from the seed. The
        # daemon refuses them (engine_args.refuse_other_weights); this keeps two of them apart
        # should a fingerprint of one ever be computed.
        settings["seed"] = str(model_config.seed)
    if current_platform.is_cpu():
        settings["cpu_isa"] = cpu_isa()
    if model_config.quantization:
        settings |= kernel_env()
    stamp = EngineStamp(engine="vllm", version=vllm.__version__, load_profile=VLLM_PROFILE, settings=settings)
    return engine_fingerprint(
        model_config.model,
        revision=model_config.revision,
        tp=(parallel.tensor_parallel_size, tp_rank),
        pp=(parallel.pipeline_parallel_size, pp_rank),
        model_config=model_config,
        backend=backend,
        device=device,
        engine=stamp,
    )
