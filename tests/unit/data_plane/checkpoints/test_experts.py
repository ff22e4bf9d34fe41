"""Qwen3-MoE planning and filling: per-expert checkpoint tensors become one stacked tensor per layer
and projection, holding exactly this rank's experts (or slices of them) at their index."""

from __future__ import annotations

import copy
import re
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from weightcache.checkpoints.checkpoint import Checkpoint, open_checkpoint
from weightcache.checkpoints.loader import fill, load_to_memory
from weightcache.checkpoints.manifest import tensor_views
from weightcache.checkpoints.pipeline import plan_rank
from weightcache.checkpoints.quantization import SCALE_SUFFIX, quantize_block_fp8, resolve
from weightcache.checkpoints.sharding import Layout
from weightcache_contract.errors import CheckpointError, ShardingError

MOE = dict(family="qwen3_moe", num_layers=2)  # hidden 128, 8 experts of width 128, 8 heads, 4 kv heads
FP8_MOE = dict(
    family="qwen3_moe",
    num_layers=2,
    hidden_size=256,
    num_heads=4,
    num_kv_heads=4,
    num_experts=4,
    moe_intermediate_size=256,
)  # every TP=2 slice of an expert is whole 128×128 blocks


def originals(ckpt: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in ckpt.glob("*.safetensors"):
        out.update(load_file(str(shard)))
    return out


def loaded(ckpt: Path, layout: Layout, quantization: str = "none", dtype: str = "float32") -> dict[str, torch.Tensor]:
    checkpoint = open_checkpoint(ckpt)
    quant = resolve(quantization, checkpoint.quantization_config)
    plan = plan_rank(checkpoint, layout, quant, dtype)
    buffer, entries = load_to_memory(checkpoint, plan, quant.weight_block_size)
    return tensor_views(buffer, entries)


def edited(ckpt: Path, drop: str | None = None, **config: object) -> Checkpoint:
    """The checkpoint's headers with one tensor left out or config keys changed (planning reads nothing else)."""
    checkpoint = copy.copy(open_checkpoint(ckpt))
    checkpoint.tensors = {k: v for k, v in checkpoint.tensors.items() if k != drop}
    checkpoint.config = {**checkpoint.config, **config}
    return checkpoint


def test_a_moe_checkpoint_maps_as_a_handful_of_tensors_per_layer(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)
    checkpoint = open_checkpoint(ckpt)
    plan = plan_rank(checkpoint, Layout(), resolve("none", None), "bfloat16")
    names = [e.name for e in plan.entries]
    # Per layer: q k v o, q/k norms, two layer norms, the router, gate_up, down.
    assert len(names) == 2 * 11 + 3 and len(checkpoint.tensors) == 2 * (9 + 8 * 3) + 3
    assert not [n for n in names if re.search(r"experts\.\d", n)]
    shapes = {e.name: e.shape for e in plan.entries}
    assert shapes["model.layers.1.mlp.experts.gate_up_proj"] == (8, 256, 128)
    assert shapes["model.layers.1.mlp.experts.down_proj"] == (8, 128, 128)
    assert shapes["model.layers.1.mlp.gate.weight"] == (8, 128)


@pytest.mark.parametrize(
    "layout",
    [Layout(), Layout(2, 1), Layout(2, 1, ep_size=2), Layout(4, 3, ep_size=2)],
    ids=["tp1", "tp2-rank1", "ep2-rank1", "tp4-ep2-rank3"],
)
def test_stacked_experts_hold_this_ranks_experts_and_slices_at_their_index(checkpoint_factory, layout: Layout) -> None:
    ckpt = checkpoint_factory(**MOE)
    full = originals(ckpt)
    tensors = loaded(ckpt, layout)
    experts = layout.expert_range(8)
    part = 128 // layout.moe_tp_size
    rows = slice(layout.moe_tp_rank * part, (layout.moe_tp_rank + 1) * part)
    gate_up, down = tensors["model.layers.1.mlp.experts.gate_up_proj"], tensors["model.layers.1.mlp.experts.down_proj"]
    assert gate_up.shape == (len(experts), 2 * part, 128) and down.shape == (len(experts), 128, part)
    for j, e in enumerate(experts):
        p = f"model.layers.1.mlp.experts.{e}."
        torch.testing.assert_close(gate_up[j, :part], full[p + "gate_proj.weight"][rows].float(), rtol=0, atol=0)
        torch.testing.assert_close(gate_up[j, part:], full[p + "up_proj.weight"][rows].float(), rtol=0, atol=0)
        torch.testing.assert_close(down[j], full[p + "down_proj.weight"][:, rows].float(), rtol=0, atol=0)
    torch.testing.assert_close(
        tensors["model.layers.1.mlp.gate.weight"], full["model.layers.1.mlp.gate.weight"].float()
    )


@pytest.mark.parametrize("prequantized", [False, True])
def test_fp8_experts_are_stacked_with_their_block_scales(checkpoint_factory, prequantized: bool) -> None:
    ckpt = checkpoint_factory(**FP8_MOE, fp8=prequantized)
    full = originals(ckpt)
    layout = Layout(2, 1)  # each expert's slice: 128 of its 256 rows (gate, up) or columns (down)
    tensors = loaded(ckpt, layout, "fp8", "bfloat16")
    name = "model.layers.0.mlp.experts."
    gate_up, scale = tensors[name + "gate_up_proj"], tensors[name + "gate_up_proj" + SCALE_SUFFIX]
    down, down_scale = tensors[name + "down_proj"], tensors[name + "down_proj" + SCALE_SUFFIX]
    assert gate_up.dtype == down.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert (gate_up.shape, scale.shape, down.shape, down_scale.shape) == (
        (4, 256, 256),
        (4, 2, 2),
        (4, 256, 128),
        (4, 2, 1),
    )
    for e in range(4):
        p = f"model.layers.0.mlp.experts.{e}."
        for k, proj in enumerate(("gate", "up")):
            if prequantized:
                want, want_scale = full[p + f"{proj}_proj.weight"][128:], full[p + f"{proj}_proj.weight_scale_inv"][1:]
            else:
                want, want_scale = quantize_block_fp8(full[p + f"{proj}_proj.weight"][128:], (128, 128))
            assert torch.equal(gate_up[e, 128 * k : 128 * (k + 1)].view(torch.uint8), want.view(torch.uint8))
            assert torch.equal(scale[e, k : k + 1], want_scale)
        if prequantized:
            want, want_scale = full[p + "down_proj.weight"][:, 128:], full[p + "down_proj.weight_scale_inv"][:, 1:]
        else:
            want, want_scale = quantize_block_fp8(full[p + "down_proj.weight"][:, 128:], (128, 128))
        assert torch.equal(down[e].view(torch.uint8), want.view(torch.uint8)) and torch.equal(down_scale[e], want_scale)


def test_stacked_entries_filled_in_parallel_get_the_crc_of_their_bytes(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)
    checkpoint = open_checkpoint(ckpt)
    plan = plan_rank(checkpoint, Layout(2, 0), resolve("none", None), "float32")
    arena = torch.zeros(plan.arena_bytes, dtype=torch.uint8)
    entries = fill(checkpoint, plan, arena, None, workers=4)
    raw = arena.numpy()
    assert all(e.checksum == zlib.crc32(raw[e.offset : e.offset + e.nbytes]) for e in entries)


def test_a_missing_expert_is_named_before_anything_is_read(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)
    checkpoint = edited(ckpt, drop="model.layers.0.mlp.experts.5.up_proj.weight")
    with pytest.raises(
        CheckpointError, match="layer 0 lacks expert 5's up_proj.weight .num_experts=8.; the checkpoint"
    ):
        plan_rank(checkpoint, Layout(), resolve("none", None), "bfloat16")
    assert checkpoint.bytes_read == 0


def test_expert_counts_that_do_not_split_over_ep_are_refused(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)
    with pytest.raises(ShardingError, match="num_experts=6 is not divisible by expert-parallel size 4"):
        plan_rank(edited(ckpt, num_local_experts=6), Layout(4, 0, ep_size=4), resolve("none", None), "bfloat16")
    with pytest.raises(CheckpointError, match="layer 0 holds expert 6, but config.json has num_experts=6"):
        plan_rank(edited(ckpt, num_local_experts=6), Layout(2, 0, ep_size=2), resolve("none", None), "bfloat16")


def test_expert_parallelism_on_a_dense_model_is_refused(llama: Path) -> None:
    with pytest.raises(ShardingError, match="--ep-size 2 needs a mixture-of-experts checkpoint.*use --ep-size 1"):
        plan_rank(open_checkpoint(llama), Layout(2, 0, ep_size=2), resolve("none", None), "bfloat16")


def test_fp8_gate_and_up_slices_that_would_share_a_scale_block_are_refused(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)  # experts 128 wide: a TP=2 slice is 64 rows, half a 128-row block
    with pytest.raises(ShardingError, match="not a multiple of the FP8 block's 128.*moe_intermediate_size / .tp / ep."):
        plan_rank(open_checkpoint(ckpt), Layout(2, 0), resolve("fp8", None), "bfloat16")
    plan_rank(open_checkpoint(ckpt), Layout(2, 0, ep_size=2), resolve("fp8", None), "bfloat16")  # whole experts: fine


def test_mixed_dense_and_moe_layers_are_refused(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE)
    with pytest.raises(CheckpointError, match="mixes dense and MoE layers"):
        plan_rank(edited(ckpt, mlp_only_layers=[1]), Layout(), resolve("none", None), "bfloat16")
