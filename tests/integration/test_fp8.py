"""Block-wise FP8: post-processed once in the daemon, deterministic, within FP8 rounding."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from weightcache.checkpoints.quantization import FP8_DTYPE, dequantize_block_fp8, quantize_block_fp8
from weightcache.checkpoints.sharding import Layout, rules_for
from weightcache.client.weights import expect, load_from_disk, load_weights

SPEC = dict(family="llama", hidden_size=256, intermediate_size=384, num_heads=4, num_kv_heads=2, num_layers=2)
# Every TP=2 shard of this one covers whole 128×128 blocks.
BLOCK_ALIGNED = dict(family="llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=4, num_layers=2)


def originals(ckpt: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.glob("*.safetensors"):
        out.update(load_file(str(shard)))
    return out


def test_daemon_quantizes_once_and_matches_a_second_load_bit_for_bit(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(**SPEC)
    daemon = start_daemon(ckpt, quantization="fp8", dtype="bfloat16")
    cached = load_weights(
        str(ckpt),
        Layout(),
        socket_dir=daemon.socket_dir,
        name=daemon.name,
        fallback="error",
        dtype="bfloat16",
        quantization="fp8",
    )
    second = load_from_disk(expect(str(ckpt), Layout(), dtype="bfloat16", quantization="fp8"))
    assert cached.mode == "cache" and set(cached.tensors) == set(second.tensors)
    for name, tensor in cached.tensors.items():
        assert tensor.dtype == second.tensors[name].dtype
        assert torch.equal(tensor.view(torch.uint8), second.tensors[name].view(torch.uint8)), name

    rules = rules_for("LlamaForCausalLM")
    full = originals(ckpt)
    quantized = 0
    for name, original in full.items():
        rule, _ = rules.rule_for(name)
        got = cached.tensors[name]
        if not rule.quantize:
            assert got.dtype == torch.bfloat16 and torch.equal(got, original), name
            continue
        quantized += 1
        scale = cached.tensors[name + "_scale_inv"]
        assert got.dtype == FP8_DTYPE and scale.dtype == torch.float32
        assert tuple(scale.shape) == (-(-original.shape[0] // 128), -(-original.shape[1] // 128))
        back = dequantize_block_fp8(got, scale, (128, 128))
        expanded = scale.repeat_interleave(128, 0)[: original.shape[0]].repeat_interleave(128, 1)[
            :, : original.shape[1]
        ]
        err = (back - original.float()).abs()
        # e4m3 rounding: ≤ 2^-4 relative, plus subnormal spacing (2^-9 of the block scale) near zero.
        assert torch.all(err <= original.float().abs() * 2**-4 + expanded * 2**-9), name
    assert quantized == 2 * 7


@pytest.mark.parametrize("tp", [1, 2])
def test_prequantized_checkpoint_is_served_as_is_and_sharded_by_whole_blocks(
    checkpoint_factory, start_daemon, tp
) -> None:
    ckpt = checkpoint_factory(**BLOCK_ALIGNED, fp8=True)
    full = originals(ckpt)
    daemon = start_daemon(ckpt, quantization="fp8", tp_size=tp, dtype="bfloat16", ranks=list(range(tp)))
    parts = [
        load_weights(
            str(ckpt),
            Layout(tp_size=tp, tp_rank=r),
            socket_dir=daemon.socket_dir,
            name=daemon.name,
            fallback="error",
            dtype="bfloat16",
            quantization="fp8",
        ).tensors
        for r in range(tp)
    ]
    rules = rules_for("LlamaForCausalLM")
    for name, original in full.items():
        rule, _ = rules.rule_for(name)
        pieces = [p[name] for p in parts]
        if rule.split.dim is None or tp == 1:
            assert all(
                torch.equal(
                    p.view(torch.uint8) if p.dtype == FP8_DTYPE else p,
                    original.view(torch.uint8) if original.dtype == FP8_DTYPE else original,
                )
                for p in pieces
            ), name
        else:
            dim = min(rule.split.dim, original.dim() - 1)
            joined = torch.cat([p.view(torch.uint8) if p.dtype == FP8_DTYPE else p for p in pieces], dim)
            want = original.view(torch.uint8) if original.dtype == FP8_DTYPE else original
            assert torch.equal(joined, want), name


def test_prequantized_shards_that_split_a_block_are_refused(checkpoint_factory, start_daemon) -> None:
    # intermediate 384 = 3 blocks of 128: two ranks cannot each hold whole blocks.
    ckpt = checkpoint_factory(**SPEC, fp8=True)
    daemon = start_daemon(ckpt, quantization="fp8", tp_size=2, wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert "whole 128-blocks" in daemon.output()
    assert not daemon.files[0].ready.exists()


def test_quantize_then_dequantize_preserves_greedy_argmax_mostly() -> None:
    # Guard against a scale convention flip (multiply vs divide): it would destroy the values entirely.
    w = torch.randn(256, 256, generator=torch.Generator().manual_seed(1))
    q, s = quantize_block_fp8(w, (128, 128))
    back = dequantize_block_fp8(q, s, (128, 128))
    assert torch.nn.functional.cosine_similarity(back.flatten(), w.flatten(), dim=0) > 0.999
