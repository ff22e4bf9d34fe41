"""Tensor- and pipeline-parallel sharding rules, one table per architecture.

Adding an architecture is a data change: write its table and register it in ``ARCHITECTURES``.
A rule says how a tensor is split across tensor-parallel ranks, which pipeline stage owns it,
and whether block-wise FP8 quantizes it. Checkpoint tensors that match no rule are an error
rather than silently dropped, because a forgotten tensor is a wrong model.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass
from typing import Any

from weightcache_contract.errors import CheckpointError, ShardingError, UnsupportedArchitecture


class Split(enum.Enum):
    """How a tensor is divided among tensor-parallel ranks."""

    REPLICATED = "replicated"  # every rank holds all of it (norms)
    COLUMN = "column"  # output features split: dim 0 (q/gate/up and their biases)
    KV_HEADS = "kv_heads"  # k/v and their biases: by KV head along dim 0, replicated when tp > KV heads
    ROW = "row"  # input features split: dim 1 (o/down)
    VOCAB = "vocab"  # vocabulary rows split: dim 0 (embedding, lm_head)
    # One expert of a mixture of experts: a rank holds it only if the expert is in its
    # expert-parallel range, and then its tensor-parallel part of it (see Layout.moe_tp_size).
    EXPERT_COLUMN = "expert-column"  # an expert's gate/up: output features split, dim 0
    EXPERT_ROW = "expert-row"  # an expert's down: input features split, dim 1

    @property
    def dim(self) -> int | None:
        return {
            Split.REPLICATED: None,
            Split.COLUMN: 0,
            Split.KV_HEADS: 0,
            Split.ROW: 1,
            Split.VOCAB: 0,
            Split.EXPERT_COLUMN: 0,
            Split.EXPERT_ROW: 1,
        }[self]

    @property
    def expert(self) -> bool:
        return self in (Split.EXPERT_COLUMN, Split.EXPERT_ROW)


class Stage(enum.Enum):
    """Which pipeline stage owns a tensor."""

    FIRST = "first"  # embedding
    LAYER = "layer"  # owned by the stage whose layer range contains the layer index
    LAST = "last"  # final norm and lm_head


@dataclass(frozen=True)
class Rule:
    pattern: str
    split: Split
    stage: Stage
    quantize: bool = False  # block-wise FP8 applies (linear weights inside decoder layers)

    @functools.cached_property
    def _compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern)

    def match(self, name: str) -> re.Match[str] | None:
        # Compiled once: a plan matches every tensor of a checkpoint (tens of thousands) against these.
        return self._compiled.fullmatch(name)


@dataclass(frozen=True)
class ArchitectureRules:
    name: str
    rules: tuple[Rule, ...]
    embedding: str
    lm_head: str

    def rule_for(self, name: str) -> tuple[Rule, int | None]:
        """The rule for a checkpoint tensor and its layer index (None outside decoder layers)."""
        base = name[: -len("_scale_inv")] if name.endswith("_scale_inv") else name
        for rule in self.rules:
            m = rule.match(base)
            if m:
                return rule, int(m.group("layer")) if "layer" in m.groupdict() else None
        raise ShardingError(
            f"tensor {name!r} matches no sharding rule of {self.name}; "
            "the checkpoint does not look like this architecture"
        )


_L = r"model\.layers\.(?P<layer>\d+)\."

_DECODER_RULES: tuple[Rule, ...] = (
    Rule(r"model\.embed_tokens\.weight", Split.VOCAB, Stage.FIRST),
    Rule(_L + r"self_attn\.q_proj\.(weight|bias)", Split.COLUMN, Stage.LAYER, quantize=True),
    Rule(_L + r"self_attn\.(k|v)_proj\.(weight|bias)", Split.KV_HEADS, Stage.LAYER, quantize=True),
    Rule(_L + r"self_attn\.o_proj\.weight", Split.ROW, Stage.LAYER, quantize=True),
    Rule(_L + r"mlp\.(gate|up)_proj\.weight", Split.COLUMN, Stage.LAYER, quantize=True),
    Rule(_L + r"mlp\.down_proj\.weight", Split.ROW, Stage.LAYER, quantize=True),
    Rule(_L + r"(input_layernorm|post_attention_layernorm)\.weight", Split.REPLICATED, Stage.LAYER),
    Rule(r"model\.norm\.weight", Split.REPLICATED, Stage.LAST),
    Rule(r"lm_head\.weight", Split.VOCAB, Stage.LAST),
)

LLAMA = ArchitectureRules("LlamaForCausalLM", _DECODER_RULES, "model.embed_tokens.weight", "lm_head.weight")
# Qwen2 is Llama-shaped with q/k/v biases, which the COLUMN and KV_HEADS rules above already cover.
QWEN2 = ArchitectureRules("Qwen2ForCausalLM", _DECODER_RULES, "model.embed_tokens.weight", "lm_head.weight")
_QK_NORM = (Rule(_L + r"self_attn\.(q_norm|k_norm)\.weight", Split.REPLICATED, Stage.LAYER),)
QWEN3 = ArchitectureRules("Qwen3ForCausalLM", _DECODER_RULES + _QK_NORM, "model.embed_tokens.weight", "lm_head.weight")

EXPERT = r"mlp\.experts\.(?P<expert>\d+)\."
"""Checkpoint names of one expert's tensors, as Hugging Face MoE checkpoints store them."""
QWEN3_MOE = ArchitectureRules(
    "Qwen3MoeForCausalLM",
    _DECODER_RULES
    + _QK_NORM
    + (
        # The router: small, read by every rank for every token, so replicated and never quantized.
        Rule(_L + r"mlp\.gate\.weight", Split.REPLICATED, Stage.LAYER),
        Rule(_L + EXPERT + r"(gate|up)_proj\.weight", Split.EXPERT_COLUMN, Stage.LAYER, quantize=True),
        Rule(_L + EXPERT + r"down_proj\.weight", Split.EXPERT_ROW, Stage.LAYER, quantize=True),
    ),
    "model.embed_tokens.weight",
    "lm_head.weight",
)

ARCHITECTURES: dict[str, ArchitectureRules] = {a.name: a for a in (LLAMA, QWEN2, QWEN3, QWEN3_MOE)}


def rules_for(architecture: str) -> ArchitectureRules:
    try:
        return ARCHITECTURES[architecture]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported; supported: {', '.join(sorted(ARCHITECTURES))}. "
            "Adding one means adding its sharding table to weightcache.checkpoints.sharding"
        ) from None


@dataclass(frozen=True)
class Layout:
    """One rank's place in the tensor × pipeline grid, and how a stage's TP group holds experts.

    ``ep_size`` divides ``tp_size``: the TP group's ranks are cut into ``ep_size`` runs of
    ``moe_tp_size = tp_size / ep_size`` consecutive ranks; run ``ep_rank`` holds the experts
    ``[ep_rank·E/ep_size, (ep_rank+1)·E/ep_size)`` and splits each of them tensor-parallel over
    its ``moe_tp_size`` ranks. ``ep_size=1`` is pure tensor parallelism (every rank a slice of
    every expert), ``ep_size=tp_size`` pure expert parallelism (whole experts per rank).
    Attention and dense layers are tensor-parallel over the whole group either way, so one
    all-reduce per layer sums experts and slices alike.
    """

    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    ep_size: int = 1

    def __post_init__(self) -> None:
        for size, rank, what in ((self.tp_size, self.tp_rank, "tp"), (self.pp_size, self.pp_rank, "pp")):
            if size < 1:
                raise ShardingError(f"--{what}-size must be >= 1, got {size}")
            if not 0 <= rank < size:
                raise ShardingError(f"--{what}-rank must be in [0, {size - 1}], got {rank}")
        if self.ep_size < 1 or self.tp_size % self.ep_size:
            raise ShardingError(
                f"--ep-size {self.ep_size} must divide --tp-size {self.tp_size}: expert-parallel ranks are the "
                "tensor-parallel ranks, each run of tp/ep of them holding whole experts; use an ep size that divides tp"
            )

    @property
    def moe_tp_size(self) -> int:
        """Ranks that split one expert between them."""
        return self.tp_size // self.ep_size

    @property
    def moe_tp_rank(self) -> int:
        return self.tp_rank % self.moe_tp_size

    @property
    def ep_rank(self) -> int:
        return self.tp_rank // self.moe_tp_size

    def expert_range(self, num_experts: int) -> range:
        """The experts this rank holds (all of them with ep_size 1); they must split evenly."""
        if num_experts % self.ep_size:
            raise ShardingError(
                f"num_experts={num_experts} is not divisible by expert-parallel size {self.ep_size}; "
                f"use an ep size that divides {num_experts}"
            )
        part = num_experts // self.ep_size
        return range(self.ep_rank * part, (self.ep_rank + 1) * part)

    @property
    def rank(self) -> int:
        """Global rank: pipeline-major, so one stage's TP group is contiguous."""
        return self.pp_rank * self.tp_size + self.tp_rank

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @classmethod
    def from_rank(cls, rank: int, tp_size: int, pp_size: int, ep_size: int = 1) -> Layout:
        if not 0 <= rank < tp_size * pp_size:
            raise ShardingError(f"rank {rank} is outside a world of {tp_size * pp_size} (tp={tp_size} × pp={pp_size})")
        return cls(tp_size, rank % tp_size, pp_size, rank // tp_size, ep_size)


def layer_range(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """Contiguous, disjoint layer ranges that cover every layer; earlier stages take the remainder."""
    if num_layers < pp_size:
        raise ShardingError(f"pipeline size {pp_size} exceeds the model's {num_layers} layers")
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def owns(rule: Rule, layer: int | None, layers: range, layout: Layout) -> bool:
    if rule.stage is Stage.FIRST:
        return layout.pp_rank == 0
    if rule.stage is Stage.LAST:
        return layout.pp_rank == layout.pp_size - 1
    return layer is not None and layer in layers


def shard_bounds(
    name: str,
    size: int,
    parts: int,
    index: int,
    granule: int = 1,
    fix: str = "choose a tensor-parallel size that divides it",
) -> tuple[int, int]:
    """Slice ``index``'s [start, stop) of ``parts`` along the split dim; the split must be even and
    granule-aligned. ``parts`` is the tp size, or the KV heads for replicated k/v (see ``kv_split``)."""
    if size % parts or (size // parts) % granule:
        raise ShardingError(
            f"tensor {name!r}: dimension {size} does not split evenly into {parts} tensor-parallel "
            f"parts{f' of whole {granule}-blocks' if granule > 1 else ''}; {fix}"
        )
    part = size // parts
    return index * part, (index + 1) * part


def kv_split(num_kv_heads: int, tp_size: int, tp_rank: int) -> tuple[int, int]:
    """(parts, part): into how many slices k/v projections split, and which one ``tp_rank`` holds.

    With at least as many KV heads as ranks, each rank holds ``num_kv_heads / tp`` of them (parts =
    tp). With more ranks than KV heads, each KV head is replicated on ``tp / num_kv_heads``
    consecutive ranks — rank r holds head ``r // (tp / num_kv_heads)``, as vLLM and SGLang do — which
    is exactly the head its query heads ``[r·H/tp, (r+1)·H/tp)`` attend with.
    """
    if num_kv_heads < 1:  # a config that does not say: k/v split like any column-parallel weight
        return tp_size, tp_rank
    if num_kv_heads >= tp_size:
        if num_kv_heads % tp_size:
            raise ShardingError(
                f"num_key_value_heads={num_kv_heads} is not divisible by tensor-parallel size {tp_size}; use a tp "
                f"size that divides {num_kv_heads}, or a multiple of it (KV heads are then replicated)"
            )
        return tp_size, tp_rank
    if tp_size % num_kv_heads:
        raise ShardingError(
            f"tensor-parallel size {tp_size} is not a multiple of num_key_value_heads={num_kv_heads}; with more "
            f"ranks than KV heads each head is replicated on tp/{num_kv_heads} ranks, so tp must be a multiple of "
            f"{num_kv_heads} (or a divisor of it)"
        )
    return num_kv_heads, tp_rank // (tp_size // num_kv_heads)


def check_heads(config: dict[str, Any], tp_size: int) -> None:
    """Query heads must split evenly; KV heads split evenly or are replicated (see ``kv_split``)."""
    heads = int(config.get("num_attention_heads") or 0)
    if heads and heads % tp_size:
        raise ShardingError(
            f"num_attention_heads={heads} is not divisible by tensor-parallel size {tp_size}; "
            f"use a tp size that divides {heads}"
        )
    kv_split(num_kv_heads(config), tp_size, 0)


def num_kv_heads(config: dict[str, Any]) -> int:
    """KV heads from a config.json; models without ``num_key_value_heads`` have one per query head."""
    return int(config.get("num_key_value_heads") or config.get("num_attention_heads") or 0)


@dataclass(frozen=True)
class Placement:
    """What the layout rules decide for one checkpoint tensor this rank holds: split ``dim`` into
    ``parts`` slices and keep slice ``index``. ``fix``: the advice when that split is uneven."""

    rule: Rule
    layer: int | None
    dim: int | None
    parts: int
    index: int
    fix: str | None = None

    @property
    def expert(self) -> bool:
        return self.rule.split.expert


@dataclass(frozen=True)
class RankRules:
    """Planning's layout-rules stage: what config.json and one rank's layout decide before any
    tensor header is looked at. ``rank_rules`` builds it (and refuses what cannot go together);
    ``place`` then answers per tensor."""

    arch: ArchitectureRules
    layout: Layout
    num_layers: int
    layers: range
    tied: bool
    kv_parts: int
    kv_part: int

    def place(self, name: str) -> Placement | None:
        """Where ``name`` goes on this rank; None when the rank does not hold it (another pipeline
        stage's, or a tied lm_head, which is the embedding)."""
        rule, layer = self.arch.rule_for(name)
        if layer is not None and layer >= self.num_layers:
            raise CheckpointError(f"tensor {name!r} names layer {layer}, but config.json has {self.num_layers} layers")
        if name == self.arch.lm_head and self.tied:
            return None
        if not owns(rule, layer, self.layers, self.layout):
            return None
        layout, dim = self.layout, rule.split.dim
        if rule.split.expert:
            return Placement(rule, layer, dim, layout.moe_tp_size, layout.moe_tp_rank)
        # k/v split by KV head, which may mean fewer slices than ranks (replicated heads).
        if rule.split is Split.KV_HEADS and self.kv_parts < layout.tp_size:
            fix = (
                f"tensor-parallel size {layout.tp_size} gives each rank one whole KV head (of {self.kv_parts}), which "
                "must be whole FP8 blocks here; use a tp size <= the KV heads, or an unquantized checkpoint with "
                "--quantization fp8 (the daemon then quantizes each rank's head itself)"
            )
            return Placement(rule, layer, dim, self.kv_parts, self.kv_part, fix)
        return Placement(rule, layer, dim, layout.tp_size, layout.tp_rank)

    @property
    def holds_lm_head_from_embedding(self) -> bool:
        """Tied embeddings: the last stage's output projection is the embedding."""
        return self.tied and self.layout.pp_rank == self.layout.pp_size - 1


def rank_rules(architecture: str, config: dict[str, Any], layout: Layout, where: str) -> RankRules:
    """What config.json alone can refuse about a layout (architecture, head and layer divisibility),
    and this rank's rules. Needs no tensor headers: a daemon checks it before it creates any file.
    ``where``: the checkpoint's directory, for the errors."""
    arch = rules_for(architecture)
    num_layers = int(config.get("num_hidden_layers", 0))
    if num_layers < 1:
        raise CheckpointError(f"{where}/config.json needs a positive num_hidden_layers")
    check_heads(config, layout.tp_size)
    layers = layer_range(num_layers, layout.pp_size, layout.pp_rank)
    kv_parts, kv_part = kv_split(num_kv_heads(config), layout.tp_size, layout.tp_rank)
    return RankRules(
        arch, layout, num_layers, layers, bool(config.get("tie_word_embeddings", False)), kv_parts, kv_part
    )
