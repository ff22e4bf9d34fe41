"""An engine's post-processed model → one sealed arena and its manifest.

Every parameter and buffer (non-persistent ones included: rotary caches, attention scales) is
copied once, under the engine's names, shapes, dtypes and strides. One tensor object reachable under
several names (tied embeddings, the rotary cache that layers share) is stored once and listed as
aliases, so the engine re-ties them.

The arena is ``cpu-shm`` for a model on the CPU and ``cuda-vmm`` for a model on a GPU (the copy
stays on the device). Either way the layout and the manifest are the same; a cuda-vmm arena is
read-only to engines through their mapping's access (``PROT_READ``), as the reference daemon's are.

A GPU that cannot hold the loaded model and the arena at once (a 60 GiB model on an 80 GB GPU) gets
the copy through host memory: every tensor is copied to one host buffer, the loaded model's GPU
memory is given back, and the arena is filled from the buffer. The peak on the GPU is then one copy
of the weights, as SGLang's own daemon has, for host memory the size of the arena for the moment.

Bytes that cross between the GPU and host memory (the host copy, its upload, the checksums' read-back)
go a piece at a time through each thread's pinned buffer on a pool of threads (``checkpoints/staging``);
through host memory, the checksums are summed from each piece as it lands, so nothing is read twice.
"""

from __future__ import annotations

import logging
import os
import zlib
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import WeightCacheError

from ..arenas.arena import Arena, create_arena
from ..checkpoints import dtypes
from ..checkpoints.loader import combined_crc
from ..checkpoints.manifest import Kind, Manifest, TensorEntry, align, tensor_views
from ..checkpoints.staging import STAGING_BYTES, PinnedStaging

log = logging.getLogger("weightcache.publisher")


@dataclass
class Published:
    arena: Arena
    manifest: Manifest


def model_tensors(model: nn.Module) -> tuple[dict[str, tuple[torch.Tensor, Kind]], dict[str, str]]:
    """name → (tensor, kind) once per tensor object, and alias name → canonical name."""
    tensors: dict[str, tuple[torch.Tensor, Kind]] = {}
    aliases: dict[str, str] = {}
    canonical: dict[int, str] = {}
    named: list[tuple[str, torch.Tensor, Kind]] = [
        (n, t, "parameter") for n, t in model.named_parameters(remove_duplicate=False)
    ]
    named += [(n, t, "buffer") for n, t in model.named_buffers(remove_duplicate=False)]
    for name, tensor, kind in named:
        first = canonical.setdefault(id(tensor), name)
        if first != name:
            aliases[name] = first
        elif name not in tensors:
            tensors[name] = (tensor, kind)
    return tensors, aliases


ROOM_MARGIN = 512 * 2**20
"""GPU memory left free beside a new arena: the CUDA context's and the copy's own allocations."""


def publish(
    model: nn.Module,
    fingerprint_digest: str,
    label: str,
    backend: str = "cpu-shm",
    device: int = 0,
    through_host: bool | None = None,
) -> Published:
    """Copy the model's tensors into a fresh ``backend`` arena (on GPU ``device`` for cuda-vmm),
    seal it, and describe it. ``through_host``: copy through host memory, giving the model's own
    memory back first (the model is unusable afterwards); None decides by the GPU's free memory."""
    if backend not in ("cpu-shm", "cuda-vmm"):
        raise WeightCacheError(
            f"an engine profile publishes cpu-shm or cuda-vmm arenas, not {backend}"
            + (
                ": a cuda-ipc handle names memory of this process's CUDA context, which the exec into the "
                "serving daemon destroys; use --backend cuda-vmm"
                if backend == "cuda-ipc"
                else ""
            )
        )
    want = torch.device("cuda", device) if backend in GPU_BACKENDS else torch.device("cpu")
    tensors, aliases = model_tensors(model)
    entries: list[TensorEntry] = []
    cursor = 0
    for name, (tensor, kind) in tensors.items():
        if tensor.device != want:
            raise WeightCacheError(
                f"{name} is on {tensor.device}; a {backend} arena on {want} holds tensors of that device only"
            )
        try:
            dtype = dtypes.to_name(tensor.dtype)
        except ValueError as exc:
            raise WeightCacheError(f"{name}: {exc}") from None
        if not _dense(tensor):
            raise WeightCacheError(
                f"{name} is not dense in memory (shape {tuple(tensor.shape)}, stride "
                f"{tensor.stride()}); the manifest describes dense tensors only"
            )
        offset = align(cursor)
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(
            TensorEntry(
                name=name,
                dtype=dtype,
                shape=tuple(tensor.shape),
                stride=tuple(tensor.stride()),
                offset=offset,
                nbytes=nbytes,
                kind=kind,
            )
        )
        cursor = offset + nbytes
    size = max(align(cursor), 1)
    if through_host is None:
        through_host = want.type == "cuda" and not _room_for(size, device)
    if through_host:
        # Said before the host allocation: a memory limit below it ends the daemon with an OOM kill.
        log.info("copying through host memory", extra={"fields": {"bytes": size, "device": str(want)}})
    with ThreadPoolExecutor(max_workers=min(16, len(os.sched_getaffinity(0))), thread_name_prefix="publish") as pool:
        pinned = None
        if want.type == "cuda":
            pinned = PinnedStaging(want)
            torch.cuda.synchronize(want)  # the engine's last writes, before the pool's streams read them
        staged = _through_host(tensors, entries, size, pool, pinned) if through_host else None
        arena = create_arena(backend, size, label, device)
        try:
            flat = arena.buffer()
            with torch.no_grad():  # engines' parameters may keep requires_grad=True
                if staged is None:
                    views = tensor_views(flat, entries)
                    for name, (tensor, _) in tensors.items():
                        views[name].copy_(tensor)
                    if flat.is_cuda:
                        torch.cuda.synchronize(flat.device)  # written before the pool's streams read it back
                    entries = checksums(flat, entries, pool, pinned)
                else:
                    host, entries = staged
                    _upload(flat, host, pool, pinned)
                    del host, staged
            if flat.is_cuda:
                torch.cuda.synchronize(flat.device)  # every copy done before the exec ends this context
            arena.seal()
        except BaseException:
            arena.close()
            raise
    return Published(arena, Manifest.build(fingerprint_digest, arena.size, entries, aliases))


def _room_for(size: int, device: int) -> bool:
    """Whether GPU ``device`` has ``size`` bytes free beside what is allocated now (the allocator's
    cached blocks given back first)."""
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(device)
    return bool(free >= size + ROOM_MARGIN)


def _chunks(entries: list[TensorEntry]) -> list[tuple[int, int, int]]:
    """(entry index, start inside the entry, length) pieces of at most one staging buffer each."""
    return [
        (i, start, min(STAGING_BYTES, e.nbytes - start))
        for i, e in enumerate(entries)
        for start in range(0, e.nbytes, STAGING_BYTES)
    ]


def _with_crcs(entries: list[TensorEntry], summed: Iterable[tuple[int, int, int, int]]) -> list[TensorEntry]:
    """``entries`` with each one's checksum combined from its pieces' (index, start, length, crc32)."""
    parts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for i, start, n, crc in summed:
        parts[i].append((start, n, crc))
    return [e.model_copy(update={"checksum": combined_crc(parts[i])}) for i, e in enumerate(entries)]


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's bytes in memory order, flat (its layout in the arena: the same strides)."""
    return tensor.detach().as_strided((tensor.numel(),), (1,)).view(torch.uint8)


def _through_host(
    tensors: dict[str, tuple[torch.Tensor, Kind]],
    entries: list[TensorEntry],
    size: int,
    pool: ThreadPoolExecutor,
    pinned: PinnedStaging | None,
) -> tuple[torch.Tensor, list[TensorEntry]]:
    """The arena's bytes in host memory, laid out as ``entries``, and the entries with their crc32s
    (summed from the host copy as it is made: nothing is read twice); then every published tensor's
    storage is emptied (views of it too, wherever the engine keeps them) and the allocator's blocks
    are given back, so the arena can take their place. The host copy is pageable: pinning the size of
    a model at once is slow to set up and can fail where pageable memory does not; each thread's
    pinned buffer carries its pieces instead."""
    staged = torch.empty(size, dtype=torch.uint8)
    end = 0
    for entry in sorted(entries, key=lambda e: e.offset):  # the alignment gaps hold zeros, as a fresh arena's
        staged[end : entry.offset].zero_()
        end = entry.offset + entry.nbytes
    staged[end:].zero_()
    raw = [_raw(tensor) for tensor, _ in tensors.values()]

    def one(piece: tuple[int, int, int]) -> tuple[int, int, int, int]:
        i, start, n = piece
        src = raw[i][start : start + n]
        dst = staged[entries[i].offset + start :][:n]
        dst.copy_(src if pinned is None else pinned.to_host(src))
        return i, start, n, zlib.crc32(dst.numpy().data)

    with torch.no_grad():
        entries = _with_crcs(entries, pool.map(one, _chunks(entries)))
        for tensor, _ in tensors.values():
            try:
                tensor.untyped_storage().resize_(0)
            except RuntimeError:
                pass  # storage the engine does not own (not resizable): it stays, and so does its memory
    torch.cuda.empty_cache()  # (nothing to do where CUDA was never initialised)
    return staged, entries


def _upload(flat: torch.Tensor, host: torch.Tensor, pool: ThreadPoolExecutor, pinned: PinnedStaging | None) -> None:
    """The host copy into the arena, a staging buffer's worth per job."""
    if pinned is None:
        flat.copy_(host)
        return

    def one(start: int) -> None:
        stop = min(start + STAGING_BYTES, host.numel())
        pinned.to_device(flat[start:stop], host[start:stop])

    for _ in pool.map(one, range(0, host.numel(), STAGING_BYTES)):
        pass


def checksums(
    raw: torch.Tensor, entries: list[TensorEntry], pool: ThreadPoolExecutor, pinned: PinnedStaging | None
) -> list[TensorEntry]:
    """``entries`` with the crc32 of each one's bytes in ``raw`` (the arena's bytes, flat). One core
    sums about 2 GB/s, so the pieces of every tensor are summed on the pool's threads (zlib and
    torch's copies let go of the GIL), a GPU's read back through each thread's pinned buffer, and each
    tensor's pieces are combined."""

    def one(piece: tuple[int, int, int]) -> tuple[int, int, int, int]:
        i, start, n = piece
        at = entries[i].offset + start
        host = raw[at : at + n] if pinned is None else pinned.to_host(raw[at : at + n])
        return i, start, n, zlib.crc32(host.numpy().data)

    return _with_crcs(entries, pool.map(one, _chunks(entries)))


def _dense(tensor: torch.Tensor) -> bool:
    """No gaps and no overlaps: the tensor's elements fill exactly ``numel`` slots (any order)."""
    if tensor.numel() <= 1:
        return True
    span = 1 + sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride()))
    return span == tensor.numel() and all(step > 0 for size, step in zip(tensor.shape, tensor.stride()) if size > 1)
