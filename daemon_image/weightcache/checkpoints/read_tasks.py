"""Planning's per-tensor stage: what one rank reads of one checkpoint tensor (its shard, the
transform) and which arena entries that produces, before the entries have offsets.

Shared by the dense tensors (``tensor_parts``) and the stacked experts (experts.py), so that a
tensor is split, quantized and cast by one set of rules whichever arena entry it ends up in.
Takes the layout rules' answer (``sharding.Placement``) as data and calls back into no stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from . import dtypes
from .checkpoint import TensorInfo
from .quantization import SCALE_SUFFIX, QuantConfig, scale_shape
from .sharding import Placement, Rule, shard_bounds

Transform = Literal["cast", "raw", "quantize_fp8"]


@dataclass(frozen=True)
class ReadTask:
    """Read ``source`` (optionally a slice of it) and produce one or two arena entries."""

    source: str
    dim: int | None
    start: int
    stop: int
    transform: Transform
    outputs: tuple[str, ...]
    read_bytes: int
    into: tuple[int, ...] = ()
    """Byte offset of each output inside its arena entry; empty: each output is a whole entry.
    Set for one expert's part of a stacked expert tensor (see experts.py)."""


@dataclass(frozen=True)
class Output:
    """An arena entry a rank's plan needs, before it has an offset (pipeline.py lays them out)."""

    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Parts:
    """Arena entries and the reads that fill them, each in planning order."""

    outputs: list[Output] = field(default_factory=list)
    tasks: list[ReadTask] = field(default_factory=list)

    def add(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        self.outputs.append(Output(name, dtype, shape))

    def task(self, task: ReadTask) -> None:
        self.tasks.append(task)


@dataclass(frozen=True)
class ShardPart:
    """This rank's part of one checkpoint tensor: [start, stop) along ``dim`` (None: all of it)."""

    info: TensorInfo
    dim: int | None
    start: int
    stop: int
    shape: tuple[int, ...]

    @property
    def read_bytes(self) -> int:
        return dtypes.itemsize(self.info.dtype) * math.prod(self.shape)

    def task(self, transform: Transform, outputs: tuple[str, ...], into: tuple[int, ...] = ()) -> ReadTask:
        return ReadTask(self.info.name, self.dim, self.start, self.stop, transform, outputs, self.read_bytes, into)


def shard_part(
    info: TensorInfo, dim: int | None, parts: int, index: int, block: tuple[int, int], fix: str | None = None
) -> ShardPart:
    """Slice ``index`` of ``info`` split along ``dim`` into ``parts`` (the tp size, or the KV heads
    for replicated k/v, see ``sharding.kv_split``); FP8 sources and their scales split by whole
    blocks. ``fix`` replaces the error's advice when the split is uneven."""
    advice = {"fix": fix} if fix else {}
    start, stop = 0, info.shape[0] if info.shape else 0
    if dim is not None and parts > 1:
        if dim >= len(info.shape):
            dim = 0  # 1-D biases of column-parallel layers split along their only axis
        if info.name.endswith(SCALE_SUFFIX):
            # Scales are per block: this rank's blocks are the weight's blocks, so the weight's
            # shard must cover whole blocks.
            start, stop = shard_bounds(info.name, info.shape[dim] * block[dim], parts, index, block[dim], **advice)
            start, stop = start // block[dim], stop // block[dim]
        else:
            granule = block[dim] if info.dtype == "float8_e4m3fn" else 1
            start, stop = shard_bounds(info.name, info.shape[dim], parts, index, granule, **advice)
    else:
        dim = None
    shape = list(info.shape)
    if dim is not None:
        shape[dim] = stop - start
    return ShardPart(info, dim, start, stop, tuple(shape))


def quantizes(quant: QuantConfig, rule: Rule, shape: tuple[int, ...]) -> bool:
    """Whether the daemon block-quantizes this (unquantized) weight into FP8 + scales."""
    return quant.method == "fp8" and not quant.prequantized and rule.quantize and len(shape) == 2


def transform_of(info: TensorInfo) -> Transform:
    """Scales, FP8 weights and integer tensors are copied as they are; floating weights are cast."""
    fp8 = info.name.endswith(SCALE_SUFFIX) or info.dtype == "float8_e4m3fn"
    return "raw" if fp8 or info.dtype not in dtypes.FLOATING_COMPUTE_DTYPES else "cast"


def output_dtype(info: TensorInfo, dtype: str) -> str:
    return info.dtype if transform_of(info) == "raw" else dtype


def tensor_parts(
    info: TensorInfo, placement: Placement, quant: QuantConfig, dtype: str, block: tuple[int, int], into: Parts
) -> None:
    """A dense tensor's entries and read: its slice, cast, or block-quantized into FP8 + scales."""
    part = shard_part(info, placement.dim, placement.parts, placement.index, block, placement.fix)
    if quantizes(quant, placement.rule, part.shape):
        scale_name = info.name + SCALE_SUFFIX
        into.add(info.name, "float8_e4m3fn", part.shape)
        into.add(scale_name, "float32", scale_shape(part.shape, block))
        into.task(part.task("quantize_fp8", (info.name, scale_name)))
    else:
        into.add(info.name, output_dtype(info, dtype), part.shape)
        into.task(part.task(transform_of(info), (info.name,)))


def tied_lm_head_parts(
    embedding: TensorInfo, lm_head: str, tp_size: int, tp_rank: int, dtype: str, into: Parts
) -> None:
    """A later pipeline stage's output projection, read from the tied embedding."""
    part = shard_part(embedding, 0, tp_size, tp_rank, (1, 1))
    into.add(lm_head, dtype, part.shape)
    into.task(part.task("cast", (lm_head,)))
