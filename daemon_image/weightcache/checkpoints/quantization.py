"""The quantization allowlist and block-wise FP8 (DeepSeek-V3 layout).

Only what has been verified end to end is allowed: unquantized weights and block-wise FP8
(float8_e4m3fn weights, one float32 ``weight_scale_inv`` per block, default 128×128). Anything
else — per-tensor FP8, AWQ, GPTQ, Marlin, bitsandbytes, or a method we have never heard of —
is refused with a message naming it, before any file or socket I/O, because serving a model
whose weights we interpret wrongly is worse than not serving it.
"""

from __future__ import annotations

import hashlib
import math
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict
from weightcache_contract.errors import UnsupportedQuantization

if TYPE_CHECKING:  # resolving the allowlist needs no torch; quantizing imports it (see dtypes.py)
    import torch

FP8_MAX = 448.0
"""The largest finite float8_e4m3fn value (``torch.finfo(torch.float8_e4m3fn).max``)."""
DEFAULT_BLOCK = (128, 128)
SCALE_SUFFIX = "_scale_inv"
SUPPORTED = "'none' and block-wise 'fp8' (float8_e4m3fn weights with weight_block_size, default [128, 128])"


class QuantConfig(BaseModel):
    """The resolved quantization of one cache; part of its fingerprint."""

    model_config = ConfigDict(frozen=True)

    method: Literal["none", "fp8"] = "none"
    weight_block_size: tuple[int, int] | None = None
    # True when the checkpoint already holds FP8 weights and scales; False when the daemon quantizes.
    prequantized: bool = False

    def sha256(self) -> str:
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()


def resolve(
    requested: str, checkpoint_config: dict[str, Any] | None, block_size: tuple[int, int] | None = None
) -> QuantConfig:
    """Combine the requested method with the checkpoint's ``quantization_config``; refuse the unverified."""
    method = (requested or "none").strip().lower()
    if method not in ("none", "fp8"):
        raise UnsupportedQuantization(f"quantization method {requested!r} is not supported; supported: {SUPPORTED}")
    if block_size is not None and (len(block_size) != 2 or min(block_size) < 1):
        raise UnsupportedQuantization(f"weight_block_size must be two positive integers, got {block_size!r}")

    if checkpoint_config:
        found = str(checkpoint_config.get("quant_method", "<missing quant_method>")).lower()
        if found != "fp8":
            raise UnsupportedQuantization(
                f"the checkpoint's config.json quantization_config uses {found!r}, which is not supported; "
                f"supported: {SUPPORTED}"
            )
        ckpt_block = checkpoint_config.get("weight_block_size")
        if not ckpt_block:
            raise UnsupportedQuantization(
                "the checkpoint is per-tensor fp8 (quantization_config has no weight_block_size), which is not "
                f"supported; supported: {SUPPORTED}"
            )
        ckpt_block = (int(ckpt_block[0]), int(ckpt_block[1]))
        if method != "fp8":
            raise UnsupportedQuantization(
                "the checkpoint holds block-wise fp8 weights; pass --quantization fp8 to serve them as they are"
            )
        if block_size is not None and tuple(block_size) != ckpt_block:
            raise UnsupportedQuantization(
                f"requested weight_block_size {list(block_size)} differs from the checkpoint's {list(ckpt_block)}"
            )
        return QuantConfig(method="fp8", weight_block_size=ckpt_block, prequantized=True)

    if method == "fp8":
        block = block_size or DEFAULT_BLOCK  # two entries, checked above (a list from JSON or argv)
        return QuantConfig(method="fp8", weight_block_size=(block[0], block[1]), prequantized=False)
    return QuantConfig()


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, int]:
    return math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1])


def __getattr__(name: str) -> Any:
    if name == "FP8_DTYPE":  # torch.float8_e4m3fn, without importing torch for every user of this module
        import torch

        return torch.float8_e4m3fn
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def quantize_block_fp8(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D weight per block; returns (float8 weight, float32 scale_inv) with w ≈ q · s."""
    import torch

    rows, cols = weight.shape
    br, bc = block
    pr, pc = math.ceil(rows / br) * br, math.ceil(cols / bc) * bc
    padded = torch.nn.functional.pad(weight.float(), (0, pc - cols, 0, pr - rows))
    blocks = padded.view(pr // br, br, pc // bc, bc)
    amax = blocks.abs().amax(dim=(1, 3))
    # An all-zero block gets scale 1 so that its quantized values are exact zeros, not NaN.
    scale_inv = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    quantized = (blocks / scale_inv[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return quantized.view(pr, pc)[:rows, :cols].contiguous(), scale_inv.contiguous()


def dequantize_block_fp8(
    quantized: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int], dtype: torch.dtype | None = None
) -> torch.Tensor:
    """The inverse of ``quantize_block_fp8`` up to rounding; float32 unless ``dtype`` says otherwise.
    Leading dimensions are batch dimensions (stacked experts: ``[E, rows, cols]`` with ``[E, …]`` scales)."""
    rows, cols = quantized.shape[-2:]
    scale = scale_inv.repeat_interleave(block[0], -2)[..., :rows, :].repeat_interleave(block[1], -1)[..., :cols]
    full = quantized.float() * scale
    return full if dtype is None else full.to(dtype)
