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
"""

from __future__ import annotations

import logging
import os
import zlib
from collections import defaultdict
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
    staged = _through_host(tensors, entries, size) if through_host else None
    arena = create_arena(backend, size, label, device)
    try:
        flat = arena.buffer()
        with torch.no_grad():  # engines' parameters may keep requires_grad=True
            if staged is not None:
                flat.copy_(staged)
            else:
                views = tensor_views(flat, entries)
                for name, (tensor, _) in tensors.items():
                    views[name].copy_(tensor)
        if flat.is_cuda:
            torch.cuda.synchronize(flat.device)  # every copy done before the exec ends this context
        # The staged bytes are the arena's, already in host memory: summed there, nothing is read back.
        entries = checksums(flat if staged is None else staged, entries)
        del staged
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


def _through_host(tensors: dict[str, tuple[torch.Tensor, Kind]], entries: list[TensorEntry], size: int) -> torch.Tensor:
    """The arena's bytes in host memory, laid out as ``entries``; then every published tensor's
    storage is emptied (views of it too, wherever the engine keeps them) and the allocator's blocks
    are given back, so the arena can take their place."""
    staged = torch.empty(size, dtype=torch.uint8)
    end = 0
    for entry in sorted(entries, key=lambda e: e.offset):  # the alignment gaps hold zeros, as a fresh arena's
        staged[end : entry.offset].zero_()
        end = entry.offset + entry.nbytes
    staged[end:].zero_()
    views = tensor_views(staged, entries)
    with torch.no_grad():
        for name, (tensor, _) in tensors.items():
            views[name].copy_(tensor)
        for tensor, _ in tensors.values():
            try:
                tensor.untyped_storage().resize_(0)
            except RuntimeError:
                pass  # storage the engine does not own (not resizable): it stays, and so does its memory
    torch.cuda.empty_cache()  # (nothing to do where CUDA was never initialised)
    return staged


CRC_CHUNK = 64 * 2**20
"""Bytes one thread reads back and sums at a time."""


def checksums(raw: torch.Tensor, entries: list[TensorEntry]) -> list[TensorEntry]:
    """``entries`` with the crc32 of each one's bytes in ``raw`` (the arena's bytes, flat). One core
    sums about 2 GB/s, so the chunks of every tensor are read back (from a GPU) and summed on a pool of
    threads, zlib and torch's copies letting go of the GIL, and each tensor's chunks are combined."""
    jobs = [
        (i, start, min(CRC_CHUNK, e.nbytes - start))
        for i, e in enumerate(entries)
        for start in range(0, e.nbytes, CRC_CHUNK)
    ]

    def one(job: tuple[int, int, int]) -> tuple[int, int, int, int]:
        i, start, n = job
        at = entries[i].offset + start
        return i, start, n, zlib.crc32(raw[at : at + n].cpu().numpy().data)

    parts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    with ThreadPoolExecutor(max_workers=min(16, len(os.sched_getaffinity(0))), thread_name_prefix="crc") as pool:
        for i, start, n, crc in pool.map(one, jobs):
            parts[i].append((start, n, crc))
    return [e.model_copy(update={"checksum": combined_crc(parts[i])}) for i, e in enumerate(entries)]


def _dense(tensor: torch.Tensor) -> bool:
    """No gaps and no overlaps: the tensor's elements fill exactly ``numel`` slots (any order)."""
    if tensor.numel() <= 1:
        return True
    span = 1 + sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride()))
    return span == tensor.numel() and all(step > 0 for size, step in zip(tensor.shape, tensor.stride()) if size > 1)
