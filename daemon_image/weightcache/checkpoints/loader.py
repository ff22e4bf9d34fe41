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
from typing import TYPE_CHECKING

from weightcache_contract.errors import CheckpointError, ShardingError

from . import dtypes
from .checkpoint import Checkpoint
from .content import ReadDigests, new_hash
from .experts import ExpertTensors
from .manifest import TensorEntry, align, contiguous_stride
from .progress import Progress
from .quantization import SCALE_SUFFIX, QuantConfig, quantize_block_fp8, scale_shape
from .read_tasks import ReadTask, output_dtype, quantizes, shard_part, transform_of
from .sharding import Layout, Split, check_heads, kv_split, layer_range, num_kv_heads, owns, rules_for

if TYPE_CHECKING:  # planning reads headers only; filling imports torch (see dtypes.py)
    import torch


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
    layers = check_layout(checkpoint, layout)
    num_layers = int(config["num_hidden_layers"])
    _check_layers_complete(checkpoint, num_layers)
    block = quant.weight_block_size or (1, 1)
    tied = bool(config.get("tie_word_embeddings", False))
    kv_parts, kv_part = kv_split(num_kv_heads(config), layout.tp_size, layout.tp_rank)

    builder = _PlanBuilder()
    experts = ExpertTensors(checkpoint, arch)
    sources = sorted(checkpoint.tensors.values(), key=lambda t: (t.file, t.name))
    for info in sources:
        rule, layer = arch.rule_for(info.name)
        if layer is not None and layer >= num_layers:
            raise CheckpointError(f"tensor {info.name!r} names layer {layer}, but config.json has {num_layers} layers")
        if info.name == arch.lm_head and tied:
            continue  # tied: lm_head is the embedding, handled below
        if not owns(rule, layer, layers, layout):
            continue
        if (info.name.endswith(SCALE_SUFFIX) or info.dtype == "float8_e4m3fn") and not quant.prequantized:
            raise CheckpointError(
                f"tensor {info.name!r} is already FP8-quantized but config.json has no block-wise "
                "quantization_config; the checkpoint is inconsistent"
            )
        if rule.split.expert:
            experts.add(info, layer)  # stacked per layer once every expert is known, below
            continue
        # k/v split by KV head, which may mean fewer slices than ranks (replicated heads).
        parts, index, fix = layout.tp_size, layout.tp_rank, None
        if rule.split is Split.KV_HEADS and kv_parts < layout.tp_size:
            parts, index = kv_parts, kv_part
            fix = (
                f"tensor-parallel size {layout.tp_size} gives each rank one whole KV head (of {kv_parts}), which "
                "must be whole FP8 blocks here; use a tp size <= the KV heads, or an unquantized checkpoint with "
                "--quantization fp8 (the daemon then quantizes each rank's head itself)"
            )
        part = shard_part(info, rule.split.dim, parts, index, block, fix)
        if quantizes(quant, rule, part.shape):
            scale_name = info.name + SCALE_SUFFIX
            builder.add(info.name, "float8_e4m3fn", part.shape)
            builder.add(scale_name, "float32", scale_shape(part.shape, block))
            builder.task(part.task("quantize_fp8", (info.name, scale_name)))
        else:
            builder.add(info.name, output_dtype(info, dtype), part.shape)
            builder.task(part.task(transform_of(info), (info.name,)))

    experts.plan(builder, layout, quant, dtype)
    if tied and layout.pp_rank == layout.pp_size - 1:
        if arch.embedding in builder.names:
            builder.aliases[arch.lm_head] = arch.embedding
        else:
            # A later pipeline stage needs the tied embedding as its output projection.
            emb = checkpoint.tensors.get(arch.embedding)
            if emb is None:
                raise CheckpointError(f"tied embeddings need {arch.embedding!r}, which the checkpoint lacks")
            part = shard_part(emb, 0, layout.tp_size, layout.tp_rank, (1, 1))
            builder.add(arch.lm_head, dtype, part.shape)
            builder.task(part.task("cast", (arch.lm_head,)))
    return LoadPlan(builder.entries, builder.tasks, builder.aliases)


def check_layout(checkpoint: Checkpoint, layout: Layout) -> range:
    """What config.json alone can refuse about a layout (architecture, head and layer divisibility);
    this rank's layers. Needs no tensor headers: a daemon checks it before it creates any file."""
    rules_for(checkpoint.architecture)
    num_layers = int(checkpoint.config.get("num_hidden_layers", 0))
    if num_layers < 1:
        raise CheckpointError(f"{checkpoint.path}/config.json needs a positive num_hidden_layers")
    check_heads(checkpoint.config, layout.tp_size)
    return layer_range(num_layers, layout.pp_size, layout.pp_rank)


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
        self.entries.append(
            TensorEntry(
                name=name, dtype=dtype, shape=shape, stride=contiguous_stride(shape), offset=offset, nbytes=nbytes
            )
        )
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


def coalesce(
    reads: list[tuple[str, int, int, ReadTask]], limit: int = STAGING_BYTES, max_gap: int = SPAN_GAP_BYTES
) -> list[FileSpan]:
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


def fill(
    checkpoint: Checkpoint,
    plan: LoadPlan,
    arena: torch.Tensor,
    block: tuple[int, int] | None,
    progress: Progress | None = None,
    checksums: bool = True,
    workers: int = 4,
    digests: ReadDigests | None = None,
) -> list[TensorEntry]:
    """Read every task's slice into its place in ``arena``; return entries (with checksums if asked).

    ``arena`` is a flat uint8 tensor in host memory or on a GPU. Tasks run on a few threads:
    preads, dtype work, host-to-device copies and crc32 all release the GIL, so reading one
    tensor overlaps post-processing, uploading and checksumming others. Tensors that need no
    transform and whose slice is contiguous in the file (whole tensors, column-parallel shards)
    are read straight into the arena (host) or, for a GPU, a span of neighbouring tensors at a
    time through a pinned staging buffer (see ``coalesce``). A task may fill only part of an entry
    (one expert of a stacked expert tensor, ``ReadTask.into``); such parts are independent jobs.
    ``digests``: also hash each task's source bytes as they are read (content.py), in the same
    threads, from the same buffers: the content identity costs no second read.
    """
    import torch

    if arena.numel() < plan.arena_bytes:
        raise ShardingError(f"arena of {arena.numel()} bytes is smaller than the plan's {plan.arena_bytes}")
    on_host = arena.device.type == "cpu"
    flat = arena.numpy() if on_host else None
    by_name = {e.name: e for e in plan.entries}
    local = threading.local()

    def place(task: ReadTask, k: int) -> tuple[TensorEntry, int]:
        """Output ``k``'s entry and the arena offset where this task's part of it starts."""
        entry = by_name[task.outputs[k]]
        return entry, entry.offset + (task.into[k] if task.into else 0)

    def hashed(task: ReadTask, data: object) -> None:
        if digests is not None:
            h = new_hash()
            h.update(data)  # type: ignore[arg-type]
            digests.add(task, h.hexdigest())

    def put(task: ReadTask, k: int, data: torch.Tensor) -> Part:
        raw = data.contiguous().reshape(-1).view(torch.uint8)
        entry, start = place(task, k)
        arena[start : start + raw.numel()].copy_(raw)
        return entry.name, start - entry.offset, raw.numel(), zlib.crc32(raw.numpy()) if checksums else 0

    def staging() -> tuple[torch.Tensor, object, torch.cuda.Stream]:
        if not hasattr(local, "staging"):
            local.staging = torch.empty(STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
            local.stream = torch.cuda.Stream(arena.device)
        return local.staging, local.staging.numpy(), local.stream

    def staged(file: str, offset: int, task: ReadTask) -> Part:
        buffer, view, stream = staging()
        entry, dest = place(task, 0)
        crc, pos = 0, 0
        content = new_hash() if digests is not None else None
        with torch.cuda.stream(stream):
            while pos < task.read_bytes:
                n = min(STAGING_BYTES, task.read_bytes - pos)
                checkpoint.pread(file, offset + pos, memoryview(view[:n]))
                if checksums:
                    crc = zlib.crc32(view[:n], crc)
                if content is not None:
                    content.update(view[:n])
                arena[dest + pos : dest + pos + n].copy_(buffer[:n], non_blocking=True)
                stream.synchronize()  # the staging buffer is reused by the next chunk
                pos += n
        if digests is not None and content is not None:
            digests.add(task, content.hexdigest())
        return entry.name, dest - entry.offset, task.read_bytes, crc

    def span_staged(span: FileSpan) -> list[Part]:
        buffer, view, stream = staging()
        checkpoint.pread(span.file, span.start, memoryview(view[: span.stop - span.start]))
        parts = []
        with torch.cuda.stream(stream):
            for offset, task in span.reads:
                entry, dest = place(task, 0)
                at, n = offset - span.start, task.read_bytes
                hashed(task, view[at : at + n])
                parts.append((entry.name, dest - entry.offset, n, zlib.crc32(view[at : at + n]) if checksums else 0))
                arena[dest : dest + n].copy_(buffer[at : at + n], non_blocking=True)
            stream.synchronize()  # the staging buffer is reused by the next span
        return parts

    def direct_read(task: ReadTask) -> tuple[str, int, int] | None:
        """(file, offset, length) when the task's bytes go to the arena exactly as they are on disk."""
        entry = by_name[task.outputs[0]]
        source = checkpoint.tensors[task.source]
        direct = task.transform == "raw" or (task.transform == "cast" and entry.dtype == source.dtype)
        if not (direct and task.dim in (None, 0)):
            return None
        stop = task.stop if task.dim == 0 else (source.shape[0] if source.shape else 0)
        file, offset, length = checkpoint.rows_span(task.source, task.start, stop)
        assert length == task.read_bytes, (task.source, length, task.read_bytes)
        return file, offset, length

    def run(job: ReadTask | FileSpan) -> tuple[int, list[Part]]:
        if isinstance(job, FileSpan):
            if len(job.reads) == 1 and job.stop - job.start > STAGING_BYTES:
                ((offset, task),) = job.reads
                return task.read_bytes, [staged(job.file, offset, task)]
            return job.read_bytes, span_staged(job)
        task = job
        where = direct_read(task)
        if where is not None and flat is not None:
            file, offset, length = where
            entry, dest = place(task, 0)
            window = flat[dest : dest + length]
            checkpoint.pread(file, offset, memoryview(window))
            hashed(task, window)
            return task.read_bytes, [(entry.name, dest - entry.offset, length, zlib.crc32(window) if checksums else 0)]
        data = checkpoint.read(task.source, task.dim, task.start, task.stop)
        if digests is not None:
            hashed(task, data.contiguous().reshape(-1).view(torch.uint8).numpy())
        if task.transform == "quantize_fp8":
            assert block is not None
            weight, scale = quantize_block_fp8(data, block)
            return task.read_bytes, [put(task, 0, weight), put(task, 1, scale)]
        return task.read_bytes, [put(task, 0, data.to(dtypes.to_torch(by_name[task.outputs[0]].dtype)))]

    jobs: list[ReadTask | FileSpan] = list(plan.tasks)
    if not on_host:
        located = [(task, direct_read(task)) for task in plan.tasks]
        jobs = [task for task, where in located if where is None]
        jobs += coalesce([(*where, task) for task, where in located if where is not None])

    parts: dict[str, list[tuple[int, int, int]]] = {}
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="load")
    try:
        for read_bytes, done in pool.map(run, jobs):
            for name, at, nbytes, crc in done:
                parts.setdefault(name, []).append((at, nbytes, crc))
            if progress is not None:
                progress.advance(read_bytes)
    finally:
        # On SIGTERM (KeyboardInterrupt here) drop the queued reads instead of finishing them.
        pool.shutdown(wait=True, cancel_futures=True)
    if not on_host:
        torch.cuda.synchronize(arena.device)
    if not checksums:
        return list(plan.entries)
    return [e.model_copy(update={"checksum": _entry_crc(parts[e.name])}) for e in plan.entries]


Part = tuple[str, int, int, int]
"""(entry name, byte offset inside the entry, length, crc32) of bytes one job wrote."""


def _entry_crc(parts: list[tuple[int, int, int]]) -> int:
    """crc32 of an entry from the crcs of the parts that tile it (stacked experts are filled by
    many jobs in parallel; combining their crcs saves a second pass over the bytes)."""
    crc = 0
    for _, nbytes, part in sorted(parts):
        crc = crc32_combine(crc, part, nbytes)
    return crc


_CRC_POLY = 0xEDB88320  # zlib's crc32, reflected


def _multmodp(a: int, b: int) -> int:
    """a·b modulo the crc polynomial (bit-reflected), as zlib computes it."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if not a & (m - 1):
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) modulo the polynomial, k = 0..31
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """crc32(a + b) from crc32(a), crc32(b) and len(b): zlib's crc32_combine, which Python lacks."""
    p, n, k = 1 << 31, len2, 3  # x^0; multiply by x^(8·len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


def read_ranges(checkpoint: Checkpoint, plan: LoadPlan) -> list[tuple[str, int, int]]:
    """(path, offset, length) of the file bytes the plan reads, in the plan's order, neighbours merged:
    what to ask the kernel to read ahead (page_cache.prefetch). A column slice (dim 1) covers its
    whole tensor, as its rows are strided through the file."""
    ranges: list[tuple[str, int, int]] = []
    for task in plan.tasks:
        info = checkpoint.tensors[task.source]
        if task.dim == 0:
            file, offset, length = checkpoint.rows_span(task.source, task.start, task.stop)
        else:
            file, offset, length = info.file, info.data_start, info.nbytes
        path = str(checkpoint.path / file)
        if ranges and ranges[-1][0] == path and 0 <= offset - (ranges[-1][1] + ranges[-1][2]) <= SPAN_GAP_BYTES:
            ranges[-1] = (path, ranges[-1][1], offset + length - ranges[-1][1])
        else:
            ranges.append((path, offset, length))
    return ranges


SYNTHETIC_REVISION = "synthetic-fill:"
"""Prefix of the revision of a synthetically filled arena: it is part of the fingerprint, so an
engine expecting the checkpoint's real weights never maps one."""


def synthetic_fill(plan: LoadPlan, arena: torch.Tensor) -> list[TensorEntry]:
    """Benchmarks only: the plan's layout with a byte pattern instead of the checkpoint's bytes.

    For arenas larger than the disk (``weightcache bench --synthetic`` on sparse checkpoints,
    ``sample_checkpoints.write_sparse_checkpoint``): everything but reading — planning,
    allocation, manifest, serving, mapping, binding, re-adoption — is the real code path.
    0x3C3C is a finite bf16 (~0.0115)."""
    arena[: plan.arena_bytes].fill_(0x3C)
    return list(plan.entries)


def load_to_memory(
    checkpoint: Checkpoint,
    plan: LoadPlan,
    block: tuple[int, int] | None,
    progress: Progress | None = None,
    device: str = "cpu",
) -> tuple[torch.Tensor, list[TensorEntry]]:
    """The disk path: the same plan, filled into private memory (host or GPU) instead of an arena."""
    import torch

    buffer = torch.zeros(plan.arena_bytes, dtype=torch.uint8, device=device)
    entries = fill(checkpoint, plan, buffer, block, progress, checksums=False)
    return buffer, entries
