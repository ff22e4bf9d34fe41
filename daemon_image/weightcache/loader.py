"""Plan and fill one rank's tensors: the loader shared by the daemon and the disk fallback.

Planning needs only the safetensors headers: it decides, per checkpoint tensor, whether this
rank owns it, which slice to read, what post-processing applies (dtype cast, block-wise FP8)
and where each output lands in the arena. Filling then reads exactly those slices. The daemon
fills a shared arena; an engine falling back to disk fills plain memory with the same plan, so
both paths produce the same bytes at the same offsets.
"""

from __future__ import annotations

import math
import re
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from . import dtypes
from .checkpoint import Checkpoint
from .errors import CheckpointError, ShardingError
from .manifest import TensorEntry, align, contiguous_stride
from .progress import Progress
from .quantization import SCALE_SUFFIX, QuantConfig, quantize_block_fp8, scale_shape
from .sharding import (Layout, Split, check_heads, kv_split, layer_range, num_kv_heads, owns, rules_for,
                       shard_bounds)

if TYPE_CHECKING:  # planning reads headers only; filling imports torch (see dtypes.py)
    import torch

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


@dataclass
class LoadPlan:
    entries: list[TensorEntry]
    tasks: list[ReadTask]
    aliases: dict[str, str] = field(default_factory=dict)

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


def plan_rank(checkpoint: Checkpoint, layout: Layout, quant: QuantConfig, dtype: str) -> LoadPlan:
    """Decide what this rank reads and where each tensor goes; raises before any data is read."""
    arch = rules_for(checkpoint.architecture)
    config = checkpoint.config
    num_layers = int(config.get("num_hidden_layers", 0))
    if num_layers < 1:
        raise CheckpointError(f"{checkpoint.path}/config.json needs a positive num_hidden_layers")
    check_heads(config, layout.tp_size)
    _check_layers_complete(checkpoint, num_layers)
    layers = layer_range(num_layers, layout.pp_size, layout.pp_rank)
    block = quant.weight_block_size or (1, 1)
    tied = bool(config.get("tie_word_embeddings", False))
    kv_parts, kv_part = kv_split(num_kv_heads(config), layout.tp_size, layout.tp_rank)

    builder = _PlanBuilder()
    sources = sorted(checkpoint.tensors.values(), key=lambda t: (t.file, t.name))
    for info in sources:
        rule, layer = arch.rule_for(info.name)
        if layer is not None and layer >= num_layers:
            raise CheckpointError(f"tensor {info.name!r} names layer {layer}, but config.json has {num_layers} layers")
        if info.name == arch.lm_head and tied:
            continue  # tied: lm_head is the embedding, handled below
        if not owns(rule, layer, layers, layout):
            continue
        is_scale = info.name.endswith(SCALE_SUFFIX)
        fp8_source = info.dtype == "float8_e4m3fn"
        if (is_scale or fp8_source) and not quant.prequantized:
            raise CheckpointError(
                f"tensor {info.name!r} is already FP8-quantized but config.json has no block-wise "
                "quantization_config; the checkpoint is inconsistent"
            )
        dim = rule.split.dim
        start, stop = 0, info.shape[0] if info.shape else 0
        # k/v split by KV head, which may mean fewer slices than ranks (replicated heads).
        parts, part, fix = layout.tp_size, layout.tp_rank, "choose a tensor-parallel size that divides it"
        if rule.split is Split.KV_HEADS and kv_parts < layout.tp_size:
            parts, part = kv_parts, kv_part
            fix = (f"tensor-parallel size {layout.tp_size} gives each rank one whole KV head (of {kv_parts}), which "
                   "must be whole FP8 blocks here; use a tp size <= the KV heads, or an unquantized checkpoint with "
                   "--quantization fp8 (the daemon then quantizes each rank's head itself)")
        if dim is not None and parts > 1:
            if dim >= len(info.shape):
                dim = 0  # 1-D biases of column-parallel layers split along their only axis
            if is_scale:
                # Scales are per block: this rank's blocks are the weight's blocks, so the weight's
                # shard must cover whole blocks.
                start, stop = shard_bounds(info.name, info.shape[dim] * block[dim], parts, part, block[dim], fix)
                start, stop = start // block[dim], stop // block[dim]
            else:
                granule = block[dim] if fp8_source else 1
                start, stop = shard_bounds(info.name, info.shape[dim], parts, part, granule, fix)
        else:
            dim = None
        shape = list(info.shape)
        if dim is not None:
            shape[dim] = stop - start
        read_bytes = dtypes.itemsize(info.dtype) * math.prod(shape)

        if quant.method == "fp8" and not quant.prequantized and rule.quantize and len(shape) == 2:
            scale_name = info.name + SCALE_SUFFIX
            builder.add(info.name, "float8_e4m3fn", tuple(shape))
            builder.add(scale_name, "float32", scale_shape(tuple(shape), block))
            builder.task(ReadTask(info.name, dim, start, stop, "quantize_fp8", (info.name, scale_name), read_bytes))
        elif is_scale or fp8_source or info.dtype not in dtypes.FLOATING_COMPUTE_DTYPES:
            builder.add(info.name, info.dtype, tuple(shape))
            builder.task(ReadTask(info.name, dim, start, stop, "raw", (info.name,), read_bytes))
        else:
            builder.add(info.name, dtype, tuple(shape))
            builder.task(ReadTask(info.name, dim, start, stop, "cast", (info.name,), read_bytes))

    if tied and layout.pp_rank == layout.pp_size - 1:
        if arch.embedding in builder.names:
            builder.aliases[arch.lm_head] = arch.embedding
        else:
            # A later pipeline stage needs the tied embedding as its output projection.
            emb = checkpoint.tensors.get(arch.embedding)
            if emb is None:
                raise CheckpointError(f"tied embeddings need {arch.embedding!r}, which the checkpoint lacks")
            start, stop = shard_bounds(emb.name, emb.shape[0], layout.tp_size, layout.tp_rank)
            shape = (stop - start, *emb.shape[1:])
            builder.add(arch.lm_head, dtype, shape)
            builder.task(ReadTask(emb.name, 0, start, stop, "cast", (arch.lm_head,),
                                  dtypes.itemsize(emb.dtype) * math.prod(shape)))
    return LoadPlan(builder.entries, builder.tasks, builder.aliases)


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
            raise CheckpointError(f"layer {layer} lacks {what}; the checkpoint is incomplete (a missing or partial shard?)")


class _PlanBuilder:
    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.tasks: list[ReadTask] = []
        self.aliases: dict[str, str] = {}
        self.names: set[str] = set()
        self._offset = 0

    def add(self, name: str, dtype: str, shape: tuple[int, ...]) -> None:
        nbytes = dtypes.itemsize(dtype) * math.prod(shape)
        offset = align(self._offset)
        self.entries.append(TensorEntry(name=name, dtype=dtype, shape=shape, stride=contiguous_stride(shape),
                                        offset=offset, nbytes=nbytes))
        self.names.add(name)
        self._offset = offset + nbytes

    def task(self, task: ReadTask) -> None:
        self.tasks.append(task)


STAGING_BYTES = 64 * 2**20
SPAN_GAP_BYTES = 1 * 2**20
"""Reading up to this many unwanted bytes between two tensors beats another read and another
synchronisation: small tensors (norms, biases) of other ranks sit between the ones we want."""


@dataclass(frozen=True)
class FileSpan:
    """Direct reads close together in one file: one pread into staging, one stream sync (GPU)."""

    file: str
    start: int
    stop: int
    reads: tuple[tuple[int, ReadTask], ...]
    """(file offset, task) of each member, in file order."""

    @property
    def read_bytes(self) -> int:
        return sum(task.read_bytes for _, task in self.reads)


def coalesce(reads: list[tuple[str, int, int, ReadTask]], limit: int = STAGING_BYTES,
             max_gap: int = SPAN_GAP_BYTES) -> list[FileSpan]:
    """Groups (file, offset, length, task) into spans of at most ``limit`` bytes whose members are
    at most ``max_gap`` apart. With 20,000 small tensors per rank, one read and one host-to-device
    synchronisation per tensor is what made the daemon slower than safetensors; per span it is
    ~100 of each for a 6 GiB rank. Reads longer than ``limit`` get a span of their own."""
    spans: list[FileSpan] = []
    current: list[tuple[int, ReadTask]] = []
    file, start, stop = "", 0, 0
    for f, offset, length, task in sorted(reads, key=lambda r: (r[0], r[1])):
        if current and f == file and offset - stop <= max_gap and offset >= stop and offset + length - start <= limit:
            current.append((offset, task))
            stop = offset + length
            continue
        if current:
            spans.append(FileSpan(file, start, stop, tuple(current)))
        current, file, start, stop = [(offset, task)], f, offset, offset + length
    if current:
        spans.append(FileSpan(file, start, stop, tuple(current)))
    return spans


def fill(checkpoint: Checkpoint, plan: LoadPlan, arena: torch.Tensor, block: tuple[int, int] | None,
         progress: Progress | None = None, checksums: bool = True, workers: int = 4) -> list[TensorEntry]:
    """Read every task's slice into its place in ``arena``; return entries (with checksums if asked).

    ``arena`` is a flat uint8 tensor in host memory or on a GPU. Tasks run on a few threads:
    preads, dtype work, host-to-device copies and crc32 all release the GIL, so reading one
    tensor overlaps post-processing, uploading and checksumming others. Tensors that need no
    transform and whose slice is contiguous in the file (whole tensors, column-parallel shards)
    are read straight into the arena (host) or, for a GPU, a span of neighbouring tensors at a
    time through a pinned staging buffer (see ``coalesce``).
    """
    import torch

    if arena.numel() < plan.arena_bytes:
        raise ShardingError(f"arena of {arena.numel()} bytes is smaller than the plan's {plan.arena_bytes}")
    on_host = arena.device.type == "cpu"
    flat = arena.numpy() if on_host else None
    by_name = {e.name: e for e in plan.entries}
    local = threading.local()

    def put(entry: TensorEntry, data: torch.Tensor) -> int:
        raw = data.contiguous().reshape(-1).view(torch.uint8)
        arena[entry.offset : entry.offset + entry.nbytes].copy_(raw)
        return zlib.crc32(raw.numpy()) if checksums else 0

    def staged(file: str, offset: int, entry: TensorEntry) -> int:
        if not hasattr(local, "staging"):
            local.staging = torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
            local.stream = torch.cuda.Stream(arena.device)
        staging, view = local.staging, local.staging.numpy()
        crc, pos = 0, 0
        with torch.cuda.stream(local.stream):
            while pos < entry.nbytes:
                n = min(STAGING_BYTES, entry.nbytes - pos)
                checkpoint.pread(file, offset + pos, memoryview(view[:n]))
                if checksums:
                    crc = zlib.crc32(view[:n], crc)
                start = entry.offset + pos
                arena[start : start + n].copy_(staging[:n], non_blocking=True)
                local.stream.synchronize()  # the staging buffer is reused by the next chunk
                pos += n
        return crc

    def span_staged(span: FileSpan) -> dict[str, int]:
        if not hasattr(local, "staging"):
            local.staging = torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
            local.stream = torch.cuda.Stream(arena.device)
        staging, view = local.staging, local.staging.numpy()
        checkpoint.pread(span.file, span.start, memoryview(view[: span.stop - span.start]))
        crcs = {}
        with torch.cuda.stream(local.stream):
            for offset, task in span.reads:
                entry = by_name[task.outputs[0]]
                at = offset - span.start
                if checksums:
                    crcs[entry.name] = zlib.crc32(view[at : at + entry.nbytes])
                arena[entry.offset : entry.offset + entry.nbytes].copy_(staging[at : at + entry.nbytes], non_blocking=True)
            local.stream.synchronize()  # the staging buffer is reused by the next span
        return crcs

    def direct_read(task: ReadTask) -> tuple[str, int, int] | None:
        """(file, offset, length) when the task's bytes go to the arena exactly as they are on disk."""
        entry = by_name[task.outputs[0]]
        source = checkpoint.tensors[task.source]
        direct = task.transform == "raw" or (task.transform == "cast" and entry.dtype == source.dtype)
        if not (direct and task.dim in (None, 0)):
            return None
        stop = task.stop if task.dim == 0 else (source.shape[0] if source.shape else 0)
        file, offset, length = checkpoint.rows_span(task.source, task.start, stop)
        assert length == entry.nbytes, (task.source, length, entry.nbytes)
        return file, offset, length

    def run(job: ReadTask | FileSpan) -> tuple[int, dict[str, int]]:
        if isinstance(job, FileSpan):
            if len(job.reads) == 1 and job.stop - job.start > STAGING_BYTES:
                (offset, task), = job.reads
                return task.read_bytes, {task.outputs[0]: staged(job.file, offset, by_name[task.outputs[0]])}
            return job.read_bytes, span_staged(job)
        task = job
        entry = by_name[task.outputs[0]]
        where = direct_read(task)
        if where is not None and flat is not None:
            file, offset, _ = where
            window = flat[entry.offset : entry.offset + entry.nbytes]
            checkpoint.pread(file, offset, memoryview(window))
            return task.read_bytes, {entry.name: zlib.crc32(window) if checksums else 0}
        data = checkpoint.read(task.source, task.dim, task.start, task.stop)
        if task.transform == "quantize_fp8":
            assert block is not None
            weight, scale = quantize_block_fp8(data, block)
            return task.read_bytes, {task.outputs[0]: put(entry, weight),
                                     task.outputs[1]: put(by_name[task.outputs[1]], scale)}
        return task.read_bytes, {entry.name: put(entry, data.to(dtypes.to_torch(entry.dtype)))}

    jobs: list[ReadTask | FileSpan] = list(plan.tasks)
    if not on_host:
        located = [(task, direct_read(task)) for task in plan.tasks]
        jobs = [task for task, where in located if where is None]
        jobs += coalesce([(*where, task) for task, where in located if where is not None])

    crc: dict[str, int] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="load")
    try:
        for read_bytes, crcs in pool.map(run, jobs):
            crc.update(crcs)
            if progress is not None:
                progress.advance(read_bytes)
    finally:
        # On SIGTERM (KeyboardInterrupt here) drop the queued reads instead of finishing them.
        pool.shutdown(wait=True, cancel_futures=True)
    if not on_host:
        torch.cuda.synchronize(arena.device)
    if not checksums:
        return list(plan.entries)
    return [e.model_copy(update={"checksum": crc[e.name]}) for e in plan.entries]


def load_to_memory(checkpoint: Checkpoint, plan: LoadPlan, block: tuple[int, int] | None,
                   progress: Progress | None = None, device: str = "cpu") -> tuple[torch.Tensor, list[TensorEntry]]:
    """The disk path: the same plan, filled into private memory (host or GPU) instead of an arena."""
    import torch

    buffer = torch.zeros(plan.arena_bytes, dtype=torch.uint8, device=device)
    entries = fill(checkpoint, plan, buffer, block, progress, checksums=False)
    return buffer, entries
