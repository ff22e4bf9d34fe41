"""Mixture-of-experts weights, stacked: one arena tensor per layer for gate+up and one for down.

Hugging Face MoE checkpoints store every expert's projections as separate tensors
(``model.layers.L.mlp.experts.E.gate_proj.weight`` …): 128 experts × 3 projections × 94 layers
is 36,000 tensors, plus as many scales with FP8. The arena instead holds, per layer,

- ``model.layers.L.mlp.experts.gate_up_proj``: ``[E_local, 2·I_local, H]``, expert e's rows
  being its gate rows then its up rows;
- ``model.layers.L.mlp.experts.down_proj``: ``[E_local, H, I_local]``;
- with block FP8, ``…_scale_inv`` beside each, stacked the same way (``[E_local, rows/128, cols/128]``).

These are transformers v5's fused expert parameters (``Qwen3MoeExperts.gate_up_proj`` and
``down_proj``, which its loader builds by the same stacking and concatenation), so a
transformers model binds them with zero copies, and the reference engine's MoE kernel indexes
them directly. A layer maps as a handful of tensors, however many experts it has. Which
experts a rank holds and which slice of each is the layout's (``Layout.expert_range``,
``moe_tp_size``); the per-expert reads are ordinary read tasks whose outputs land at an offset
inside the stacked entry (``ReadTask.into``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from weightcache_contract.errors import CheckpointError, ShardingError

from . import dtypes
from .checkpoint import TensorInfo
from .quantization import SCALE_SUFFIX, QuantConfig, scale_shape
from .read_tasks import Parts, ShardPart, output_dtype, quantizes, shard_part, transform_of
from .sharding import Layout, Placement

GATE_UP = "gate_up_proj"
DOWN = "down_proj"
PROJECTIONS = ("gate", "up", "down")
# The fused tensors and what each stacks (in row order within an expert); how an expert splits
# is the layout rules' (sharding.Split.EXPERT_COLUMN / EXPERT_ROW, in each tensor's Placement).
FUSED: tuple[tuple[str, tuple[str, ...]], ...] = (
    (GATE_UP, ("gate", "up")),
    (DOWN, ("down",)),
)
_EXPERT_TENSOR = re.compile(
    r"model\.layers\.(?P<layer>\d+)\.mlp\.experts\.(?P<expert>\d+)\.(?P<proj>gate|up|down)_proj\.weight"
    r"(?P<scale>_scale_inv)?"
)


def fused_name(layer: int, fused: str) -> str:
    return f"model.layers.{layer}.mlp.experts.{fused}"


def num_experts(config: dict[str, Any]) -> int:
    """transformers writes Qwen3-MoE's ``num_experts`` as ``num_local_experts`` (its attribute map)."""
    return int(config.get("num_experts") or config.get("num_local_experts") or 0)


class ExpertTensors:
    """Collects a checkpoint's per-expert tensors (and where the layout rules place each) while
    planning walks the checkpoint, then plans the stacks: planning's per-tensor stage for experts."""

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        self.config = config
        self.path = path
        self.found: dict[int, dict[tuple[int, str, bool], TensorInfo]] = {}
        self.placements: dict[str, Placement] = {}

    def add(self, info: TensorInfo, placement: Placement) -> None:
        m = _EXPERT_TENSOR.fullmatch(info.name)
        layer = placement.layer
        if m is None or layer is None:
            raise CheckpointError(
                f"tensor {info.name!r} looks like an expert's but is not named "
                "model.layers.L.mlp.experts.E.(gate|up|down)_proj.weight[_scale_inv]"
            )
        self.found.setdefault(layer, {})[(int(m["expert"]), m["proj"], bool(m["scale"]))] = info
        self.placements[info.name] = placement

    def plan(self, layout: Layout, quant: QuantConfig, dtype: str) -> Parts:
        """This rank's stacked entries and the read tasks that fill them, layer by layer."""
        builder = Parts()
        if not self.found:
            if layout.ep_size > 1:
                raise ShardingError(
                    f"--ep-size {layout.ep_size} needs a mixture-of-experts checkpoint, and "
                    f"{self.path} has no experts; use --ep-size 1"
                )
            return builder
        total = num_experts(self.config)
        if total < 1:
            raise CheckpointError(f"{self.path}/config.json has no num_experts, but the checkpoint holds experts")
        if self.config.get("mlp_only_layers") or int(self.config.get("decoder_sparse_step") or 1) != 1:
            raise CheckpointError(
                f"{self.path}/config.json mixes dense and MoE layers (mlp_only_layers or "
                "decoder_sparse_step != 1), which is not supported; every layer must be MoE"
            )
        owned = layout.expert_range(total)
        block = quant.weight_block_size or (1, 1)
        for layer in sorted(self.found):
            parts = self.found[layer]
            self._check_complete(layer, parts, total)
            for fused, projs in FUSED:
                weights = [[self._part(parts[(e, p, False)], block) for p in projs] for e in owned]
                self._plan_stack(builder, fused_name(layer, fused), weights, quant, dtype, block)
                if weights[0][0].info.dtype == "float8_e4m3fn":
                    scales = [[self._part(parts[(e, p, True)], block) for p in projs] for e in owned]
                    expected = scale_shape(weights[0][0].shape, block)
                    if scales[0][0].shape != expected:
                        raise CheckpointError(
                            f"{scales[0][0].info.name!r} has shape {scales[0][0].shape}, but its "
                            f"weight's {block[0]}×{block[1]} blocks need {expected}"
                        )
                    self._plan_stack(builder, fused_name(layer, fused) + SCALE_SUFFIX, scales, quant, dtype, block)
        return builder

    def _part(self, info: TensorInfo, block: tuple[int, int]) -> ShardPart:
        placement = self.placements[info.name]
        return shard_part(info, placement.dim, placement.parts, placement.index, block)

    def _check_complete(self, layer: int, parts: dict[tuple[int, str, bool], TensorInfo], total: int) -> None:
        for expert, _proj, _ in parts:
            if expert >= total:
                raise CheckpointError(f"layer {layer} holds expert {expert}, but config.json has num_experts={total}")
        for expert in range(total):
            for proj in PROJECTIONS:
                weight = parts.get((expert, proj, False))
                if weight is None:
                    raise CheckpointError(
                        f"layer {layer} lacks expert {expert}'s {proj}_proj.weight (num_experts="
                        f"{total}); the checkpoint is incomplete (a missing or partial shard?)"
                    )
                if weight.dtype == "float8_e4m3fn" and (expert, proj, True) not in parts:
                    raise CheckpointError(f"{weight.name!r} is FP8 but the checkpoint lacks its {SCALE_SUFFIX}")

    def _plan_stack(
        self,
        builder: Parts,
        name: str,
        members: list[list[ShardPart]],
        quant: QuantConfig,
        dtype: str,
        block: tuple[int, int],
    ) -> None:
        """One stacked entry ``[experts, len(row)·rows, cols]`` from ``members[expert][k]`` parts."""
        first = members[0][0]
        for part in (p for row in members for p in row):
            if part.shape != first.shape or part.info.dtype != first.info.dtype:
                raise CheckpointError(
                    f"{part.info.name!r} is {part.info.dtype} {part.shape} but "
                    f"{first.info.name!r} is {first.info.dtype} {first.shape}; the experts of a "
                    "layer must agree in shape and dtype to be stacked"
                )
        quantize = quantizes(quant, self.placements[first.info.name].rule, first.shape)
        rows, cols = first.shape
        per_expert = len(members[0])
        is_fp8 = quantize or first.info.dtype == "float8_e4m3fn"
        if is_fp8 and per_expert > 1 and rows % block[0] and not name.endswith(SCALE_SUFFIX):
            raise ShardingError(
                f"{name}: each rank's gate and up of one expert have {rows} rows, not a multiple of the FP8 block's "
                f"{block[0]}, so a scale block would straddle gate and up; choose tp/ep so that "
                f"moe_intermediate_size / (tp / ep) is a multiple of {block[0]}"
            )
        out_dtype = "float8_e4m3fn" if quantize else output_dtype(first.info, dtype)
        builder.add(name, out_dtype, (len(members), per_expert * rows, cols))
        step = dtypes.itemsize(out_dtype) * rows * cols
        if quantize:
            srows, scols = scale_shape(first.shape, block)
            builder.add(name + SCALE_SUFFIX, "float32", (len(members), per_expert * srows, scols))
            scale_step = 4 * srows * scols
        for e, row in enumerate(members):
            for k, part in enumerate(row):
                at = e * per_expert + k
                if quantize:
                    builder.task(part.task("quantize_fp8", (name, name + SCALE_SUFFIX), (at * step, at * scale_step)))
                else:
                    builder.task(part.task(transform_of(part.info), (name,), (at * step,)))
