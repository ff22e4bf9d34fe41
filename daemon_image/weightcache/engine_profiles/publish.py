"""An engine's post-processed model → one sealed arena and its manifest.

Every parameter and buffer (non-persistent ones included: rotary caches, attention scales) is
copied once, under the engine's names, shapes, dtypes and strides. One tensor object reachable under
several names (tied embeddings, the rotary cache that layers share) is stored once and listed as
aliases, so the engine re-ties them.

The arena is ``cpu-shm`` for a model on the CPU and ``cuda-vmm`` for a model on a GPU (the copy
stays on the device). Either way the layout and the manifest are the same; a cuda-vmm arena is
read-only to engines through their mapping's access (``PROT_READ``), as the reference daemon's are.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import nn
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import WeightCacheError

from ..arenas.arena import Arena, create_arena
from ..checkpoints import dtypes
from ..checkpoints.manifest import Kind, Manifest, TensorEntry, align, tensor_views


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


def publish(
    model: nn.Module, fingerprint_digest: str, label: str, backend: str = "cpu-shm", device: int = 0
) -> Published:
    """Copy the model's tensors into a fresh ``backend`` arena (on GPU ``device`` for cuda-vmm),
    seal it, and describe it."""
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
    arena = create_arena(backend, max(align(cursor), 1), label, device)
    try:
        flat = arena.buffer()
        views = tensor_views(flat, entries)
        with torch.no_grad():  # engines' parameters may keep requires_grad=True
            for name, (tensor, _) in tensors.items():
                views[name].copy_(tensor)
        if flat.is_cuda:
            torch.cuda.synchronize(flat.device)  # every copy done before the exec ends this context
        entries = [e.model_copy(update={"checksum": _crc32(flat[e.offset : e.offset + e.nbytes])}) for e in entries]
        arena.seal()
    except BaseException:
        arena.close()
        raise
    return Published(arena, Manifest.build(fingerprint_digest, arena.size, entries, aliases))


def _crc32(raw: torch.Tensor) -> int:
    """The manifest's checksum of one tensor's bytes (a GPU arena's are read back one tensor at a time)."""
    return zlib.crc32(raw.cpu().numpy().data)


def _dense(tensor: torch.Tensor) -> bool:
    """No gaps and no overlaps: the tensor's elements fill exactly ``numel`` slots (any order)."""
    if tensor.numel() <= 1:
        return True
    span = 1 + sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride()))
    return span == tensor.numel() and all(step > 0 for size, step in zip(tensor.shape, tensor.stride()) if size > 1)
