"""What one rank reads of one checkpoint tensor: its shard, the transform, where the output lands.

Shared by the dense plan (loader.py) and the stacked-expert plan (experts.py), so that a tensor
is split, quantized and cast by one set of rules whichever arena entry it ends up in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from . import dtypes
from .checkpoint import TensorInfo
from .quantization import SCALE_SUFFIX, QuantConfig
from .sharding import Rule, shard_bounds

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
