"""Qwen3-MoE on a GPU: block-FP8 experts stacked by a cuda-vmm daemon, computed where they lie."""

from __future__ import annotations

import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import load_weights
from weightcache.engine.config import ModelConfig
from weightcache.engine.model import Model
from weightcache.engine.parallel import Group
from weightcache.tools.reference_hf import dequantized_hf_model

pytestmark = pytest.mark.gpu
PROMPT = [3, 17, 101, 7, 250, 42, 9, 300, 12]
FP8_MOE = dict(
    family="qwen3_moe",
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    num_experts=4,
    moe_intermediate_size=128,
    fp8=True,
)


def test_fp8_moe_mapped_from_a_cuda_vmm_daemon_matches_transformers_on_the_gpu(
    checkpoint_factory, start_daemon
) -> None:
    ckpt = checkpoint_factory(**FP8_MOE)
    daemon = start_daemon(ckpt, backend="cuda-vmm", quantization="fp8", dtype="float32")
    weights = load_weights(
        str(ckpt),
        Layout(),
        socket_dir=daemon.socket_dir,
        name=daemon.name,
        fallback="error",
        dtype="float32",
        quantization="fp8",
        backend="cuda-vmm",
    )
    model = Model(ModelConfig.from_checkpoint(ckpt), weights.tensors, weights.aliases, Group(), (128, 128))
    assert weights.mode == "cache" and model.device.type == "cuda"
    assert weights.arena is not None
    lo, hi = weights.arena.address_range
    assert all(lo <= t.data_ptr() < hi for _, t in model.weights())
    got = model.forward(torch.tensor(PROMPT), model.new_cache(len(PROMPT)), all_logits=True)
    reference = dequantized_hf_model(ckpt, weights, "float32", (128, 128))
    with torch.inference_mode():
        want = reference(torch.tensor([PROMPT], device="cuda")).logits[0].float()
    # GPU float32 kernels sum in other orders than the CPU's; 1e-3 is still far below a real bug's O(0.1).
    torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)
