import pytest
import torch
from weightcache.checkpoints.quantization import (
    FP8_DTYPE,
    QuantConfig,
    dequantize_block_fp8,
    quantize_block_fp8,
    resolve,
    scale_shape,
)
from weightcache_contract.errors import UnsupportedQuantization


@pytest.mark.parametrize("method", ["awq", "gptq", "marlin", "bitsandbytes", "fp8-per-tensor", "int4"])
def test_requested_methods_outside_the_allowlist_are_refused_by_name(method: str) -> None:
    with pytest.raises(
        UnsupportedQuantization, match=f"quantization method '{method}' is not supported; supported: 'none'"
    ):
        resolve(method, None)


@pytest.mark.parametrize(
    "config, message",
    [
        ({"quant_method": "fp8", "activation_scheme": "static"}, "per-tensor fp8"),
        ({"quant_method": "awq", "bits": 4}, "uses 'awq', which is not supported"),
        ({"quant_method": "gptq", "bits": 4}, "uses 'gptq', which is not supported"),
        ({"quant_method": "marlin"}, "uses 'marlin', which is not supported"),
        ({"quant_method": "compressed-tensors"}, "uses 'compressed-tensors', which is not supported"),
        ({"bits": 4}, "uses '<missing quant_method>'"),
    ],
)
def test_checkpoint_quantization_configs_outside_the_allowlist_are_refused(config: dict, message: str) -> None:
    with pytest.raises(UnsupportedQuantization, match=message):
        resolve("fp8", config)


def test_allowlisted_methods_resolve() -> None:
    assert resolve("none", None) == QuantConfig()
    assert resolve("FP8", None) == QuantConfig(method="fp8", weight_block_size=(128, 128))
    pre = resolve("fp8", {"quant_method": "fp8", "weight_block_size": [64, 64]})
    assert pre == QuantConfig(method="fp8", weight_block_size=(64, 64), prequantized=True)
    with pytest.raises(UnsupportedQuantization, match="pass --quantization fp8"):
        resolve("none", {"quant_method": "fp8", "weight_block_size": [128, 128]})
    with pytest.raises(UnsupportedQuantization, match="differs from the checkpoint"):
        resolve("fp8", {"quant_method": "fp8", "weight_block_size": [128, 128]}, (64, 64))


@pytest.mark.parametrize("shape", [(256, 384), (300, 130), (128, 128), (1, 5)])
def test_block_fp8_round_trip_is_within_fp8_rounding(shape: tuple[int, int]) -> None:
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 3
    q, s = quantize_block_fp8(w, (128, 128))
    assert q.dtype == FP8_DTYPE and q.shape == w.shape
    assert s.dtype == torch.float32 and tuple(s.shape) == scale_shape(shape, (128, 128))
    back = dequantize_block_fp8(q, s, (128, 128))
    # e4m3 keeps 3 mantissa bits: relative rounding error ≤ 2^-4 of each value's block-scaled magnitude,
    # plus values below the smallest normal (2^-6 · scale) are rounded in absolute terms.
    scale = s.repeat_interleave(128, 0)[: shape[0]].repeat_interleave(128, 1)[:, : shape[1]]
    assert torch.all((back - w).abs() <= w.abs() * 2**-4 + scale * 2**-9)
    # Quantization is deterministic.
    q2, s2 = quantize_block_fp8(w, (128, 128))
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(s, s2)


def test_all_zero_block_quantizes_to_exact_zeros() -> None:
    q, s = quantize_block_fp8(torch.zeros(128, 128), (128, 128))
    assert torch.all(dequantize_block_fp8(q, s, (128, 128)) == 0) and torch.all(s == 1)
