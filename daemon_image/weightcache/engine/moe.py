"""The mixture-of-experts MLP (Qwen3-MoE) over stacked expert views, tensor- or expert-parallel.

The router is replicated: every rank scores all experts for every token (softmax in float32,
top-k, optionally renormalised, cast to the activation dtype), exactly as transformers'
``Qwen3MoeTopKRouter`` does, so all ranks agree on the routing without communicating. Each
rank then runs only the experts it holds (``Layout.expert_range``) with its slice of each
(``moe_tp_size``), straight from the stacked arena tensors ``gate_up_proj [E_local, 2·I, H]``
and ``down_proj [E_local, H, I]`` (see weightcache/experts.py), and returns its partial sum;
the decoder layer's all-reduce adds the other experts and slices. Each expert's output is
weighted in the activation dtype and the top-k contributions are summed in float32 and rounded
once, as transformers' default experts implementation (``grouped_mm``) does; summing in bf16
instead (its ``eager`` path) rounds after every expert and no longer gives transformers' bytes.
A block-FP8 expert is dequantized whole (it is small: one expert, one rank's slice) into a
temporary for its matmul.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..checkpoints.quantization import SCALE_SUFFIX, dequantize_block_fp8
from ..checkpoints.sharding import Layout
from .config import ModelConfig

if TYPE_CHECKING:  # model.py imports this module
    from .model import _Getter as Getter


class SparseMoe:
    def __init__(
        self, prefix: str, cfg: ModelConfig, layout: Layout, get: Getter, block: tuple[int, int] | None
    ) -> None:
        experts = layout.expert_range(cfg.num_experts)
        inter = cfg.moe_intermediate_size // layout.moe_tp_size
        hidden = cfg.hidden_size
        self.first = experts.start
        self.count = len(experts)
        self.top_k = cfg.num_experts_per_tok
        self.normalize = cfg.norm_topk_prob
        self.router = get(prefix + "gate.weight", (cfg.num_experts, hidden))
        self.gate_up = get(prefix + "experts.gate_up_proj", (self.count, 2 * inter, hidden))
        self.down = get(prefix + "experts.down_proj", (self.count, hidden, inter))
        self.gate_up_scale = get.optional(prefix + "experts.gate_up_proj" + SCALE_SUFFIX)
        self.down_scale = get.optional(prefix + "experts.down_proj" + SCALE_SUFFIX)
        self.block = block
        self.prefix = prefix

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        out = [
            (self.prefix + "gate.weight", self.router),
            (self.prefix + "experts.gate_up_proj", self.gate_up),
            (self.prefix + "experts.down_proj", self.down),
        ]
        if self.gate_up_scale is not None and self.down_scale is not None:
            out += [
                (self.prefix + "experts.gate_up_proj" + SCALE_SUFFIX, self.gate_up_scale),
                (self.prefix + "experts.down_proj" + SCALE_SUFFIX, self.down_scale),
            ]
        return out

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [n, k] in h's dtype, expert ids [n, k]) for every token, as transformers routes."""
        probs = F.softmax(F.linear(h, self.router), dim=-1, dtype=torch.float)
        top, ids = torch.topk(probs, self.top_k, dim=-1)
        if self.normalize:
            top /= top.sum(dim=-1, keepdim=True)
        return top.to(h.dtype), ids

    def _weight(self, stacked: torch.Tensor, scale: torch.Tensor | None, e: int, dtype: torch.dtype) -> torch.Tensor:
        if scale is None:
            return stacked[e]
        assert self.block is not None
        return dequantize_block_fp8(stacked[e], scale[e], self.block, dtype)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """This rank's share of the MoE output for h [n, hidden]; the caller all-reduces it."""
        weights, ids = self.route(h)
        out = torch.zeros(h.shape, dtype=torch.float32, device=h.device)
        local = ids - self.first
        hit = torch.unique(local[(local >= 0) & (local < self.count)]).tolist()
        for e in hit:
            token, slot = torch.where(local == e)
            x = h[token]
            gate, up = F.linear(x, self._weight(self.gate_up, self.gate_up_scale, e, h.dtype)).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self._weight(self.down, self.down_scale, e, h.dtype))
            out.index_add_(0, token, (y * weights[token, slot, None]).float())
        return out.to(h.dtype)
