"""Fill one rank's tensors from its plan: the loader shared by the daemon and the disk fallback.

Planning (pipeline.py) decides, from the safetensors headers, which slice of which tensor this
rank reads, what post-processing applies (dtype cast, block-wise FP8) and where each output
lands; filling reads exactly those slices. The daemon fills a shared arena; an engine falling
back to disk fills plain memory with the same plan, so both paths produce the same bytes at the
same offsets.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from weightcache_contract.errors import ShardingError

from . import dtypes
from .checkpoint import Checkpoint
from .content import ReadDigests, new_hash
from .manifest import TensorEntry
from .pipeline import LoadPlan
from .progress import Progress
from .quantization import quantize_block_fp8
from .read_tasks import ReadTask
from .staging import STAGING_BYTES, PinnedStaging

if TYPE_CHECKING:  # planning reads headers only; filling imports torch (see dtypes.py)
    import torch


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
    flat = arena.numpy().data if on_host else None  # a memoryview: the buffer protocol, typed
    by_name = {e.name: e for e in plan.entries}
    pinned = PinnedStaging(arena.device)

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
        return entry.name, start - entry.offset, raw.numel(), zlib.crc32(raw.numpy().data) if checksums else 0

    def staged(file: str, offset: int, task: ReadTask) -> Part:
        buffer, view, stream = pinned.get()
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
        buffer, view, stream = pinned.get()
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
    return [e.model_copy(update={"checksum": combined_crc(parts[e.name])}) for e in plan.entries]


Part = tuple[str, int, int, int]
"""(entry name, byte offset inside the entry, length, crc32) of bytes one job wrote."""


def combined_crc(parts: list[tuple[int, int, int]]) -> int:
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
