"""Planning one rank, as a pipeline read top to bottom: what it reads and where each tensor lands.

Planning needs only config.json and the safetensors headers. Its stages, each a module that
calls only stages below it (none calls back into its caller):

1. **config** (``checkpoint``, ``quantization``, ``resolve_dtype`` here): the opened checkpoint,
   the quantization and the dtype;
2. **layout rules** (``sharding.rank_rules``): what the architecture's table and this rank's
   layout decide, refused before any file is created (``check_layout``); per tensor,
   ``RankRules.place``: whether this rank holds it and how it splits;
3. **per-tensor parts** (``read_tasks.tensor_parts``, stacked experts in ``experts``): each held
   tensor's slice, transform and arena entries, without offsets;
4. **rank plan** (``_ArenaLayout`` here): the entries laid out at aligned offsets — a
   ``LoadPlan``, which ``loader.fill`` reads into an arena or plain memory.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from weightcache_contract.errors import CheckpointError

from . import dtypes
from .checkpoint import Checkpoint
from .experts import ExpertTensors
from .manifest import TensorEntry, align, contiguous_stride
from .quantization import SCALE_SUFFIX, QuantConfig
from .read_tasks import Parts, ReadTask, tensor_parts, tied_lm_head_parts
from .sharding import Layout, RankRules, rank_rules


@dataclass
class LoadPlan:
    entries: list[TensorEntry]
    tasks: list[ReadTask]
    aliases: dict[str, str] = field(default_factory=dict)
    layers: range = range(0)
    """The decoder layers this rank's pipeline stage holds."""

    @property
    def arena_bytes(self) -> int:
        end = max((e.offset + e.nbytes for e in self.entries), default=0)
        return max(align(end), 256)

    @property
    def read_bytes(self) -> int:
        return sum(t.read_bytes for t in self.tasks)


def resolve_dtype(requested: str, checkpoint: Checkpoint) -> str:
    name = requested
    if requested == "auto":
        name = checkpoint.torch_dtype_name or "bfloat16"
        name = name.replace("torch.", "")
    if name not in dtypes.FLOATING_COMPUTE_DTYPES:
        raise CheckpointError(
            f"dtype {name!r} cannot be served; choose one of {', '.join(dtypes.FLOATING_COMPUTE_DTYPES)} or 'auto'"
        )
    return name


def check_layout(checkpoint: Checkpoint, layout: Layout) -> RankRules:
    """What config.json alone can refuse about a layout (architecture, head and layer divisibility);
    this rank's rules. Needs no tensor headers: a daemon checks it before it creates any file."""
    return rank_rules(checkpoint.architecture, checkpoint.config, layout, str(checkpoint.path))


def plan_rank(checkpoint: Checkpoint, layout: Layout, quant: QuantConfig, dtype: str) -> LoadPlan:
    """Decide what this rank reads and where each tensor goes; raises before any data is read."""
    # 2. layout rules
    rules = check_layout(checkpoint, layout)
    _check_layers_complete(checkpoint, rules.num_layers)
    block = quant.weight_block_size or (1, 1)

    # 3. per-tensor parts, in file order; experts are stacked per layer once every one is known
    dense = Parts()
    experts = ExpertTensors(checkpoint.config, checkpoint.path)
    for info in sorted(checkpoint.tensors.values(), key=lambda t: (t.file, t.name)):
        placement = rules.place(info.name)
        if placement is None:
            continue
        if (info.name.endswith(SCALE_SUFFIX) or info.dtype == "float8_e4m3fn") and not quant.prequantized:
            raise CheckpointError(
                f"tensor {info.name!r} is already FP8-quantized but config.json has no block-wise "
                "quantization_config; the checkpoint is inconsistent"
            )
        if placement.expert:
            experts.add(info, placement)
        else:
            tensor_parts(info, placement, quant, dtype, block, dense)
    stacked = experts.plan(layout, quant, dtype)

    # 4. rank plan
    arena = _ArenaLayout()
    arena.place(dense)
    arena.place(stacked)
    if rules.holds_lm_head_from_embedding:
        lm_head, embedding = rules.arch.lm_head, rules.arch.embedding
        if embedding in arena.names:
            arena.aliases[lm_head] = embedding
        else:
            # A later pipeline stage needs the tied embedding as its output projection.
            emb = checkpoint.tensors.get(embedding)
            if emb is None:
                raise CheckpointError(f"tied embeddings need {embedding!r}, which the checkpoint lacks")
            head = Parts()
            tied_lm_head_parts(emb, lm_head, layout.tp_size, layout.tp_rank, dtype, head)
            arena.place(head)
    return LoadPlan(arena.entries, arena.tasks, arena.aliases, rules.layers)


def _check_layers_complete(checkpoint: Checkpoint, num_layers: int) -> None:
    """Every decoder layer must carry the same tensors; a hole is a broken checkpoint, not a smaller model."""
    per_layer: dict[int, set[str]] = {}
    for name in checkpoint.tensors:
        m = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if m:
            per_layer.setdefault(int(m.group(1)), set()).add(m.group(2))
    expected = per_layer.get(0, set())
    for layer in range(num_layers):
        missing = expected - per_layer.get(layer, set())
        if layer not in per_layer or missing:
            what = f"{sorted(missing)[0]!r}" if missing and layer in per_layer else "all its tensors"
            raise CheckpointError(
                f"layer {layer} lacks {what}; the checkpoint is incomplete (a missing or partial shard?)"
            )


class _ArenaLayout:
    """Entries at aligned offsets, in the order they are placed."""

    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.tasks: list[ReadTask] = []
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()
        self._offset = 0

    def place(self, parts: Parts) -> None:
        for out in parts.outputs:
            nbytes = dtypes.itemsize(out.dtype) * math.prod(out.shape)
            offset = align(self._offset)
            self.entries.append(
                TensorEntry(
                    name=out.name,
                    dtype=out.dtype,
                    shape=out.shape,
                    stride=contiguous_stride(out.shape),
                    offset=offset,
                    nbytes=nbytes,
                )
            )
            self.names.add(out.name)
            self._offset = offset + nbytes
        self.tasks.extend(parts.tasks)
