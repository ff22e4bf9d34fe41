"""A post-processed vLLM model → one sealed ``cpu-shm`` arena and its manifest.

Every parameter and buffer (non-persistent ones included: rotary caches, attention scales) is
copied once, under vLLM's names, shapes, dtypes and strides. One tensor object reachable under
several names (tied embeddings, the rotary cache that layers share) is stored once and listed as
aliases, so the engine re-ties them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch
from torch import nn
from weightcache_contract.errors import WeightCacheError

from ..arenas.arena import CpuShmArena
from ..checkpoints import dtypes
from ..checkpoints.manifest import Manifest, TensorEntry, align, tensor_views


@dataclass
class Published:
    arena: CpuShmArena
    manifest: Manifest


def model_tensors(model: nn.Module) -> tuple[dict[str, tuple[torch.Tensor, str]], dict[str, str]]:
    """name → (tensor, kind) once per tensor object, and alias name → canonical name."""
    tensors: dict[str, tuple[torch.Tensor, str]] = {}
    aliases: dict[str, str] = {}
    canonical: dict[int, str] = {}
    named = [(n, t, "parameter") for n, t in model.named_parameters(remove_duplicate=False)]
    named += [(n, t, "buffer") for n, t in model.named_buffers(remove_duplicate=False)]
    for name, tensor, kind in named:
        first = canonical.setdefault(id(tensor), name)
        if first != name:
            aliases[name] = first
        elif name not in tensors:
            tensors[name] = (tensor, kind)
    return tensors, aliases


def publish(model: nn.Module, fingerprint_digest: str, label: str) -> Published:
    """Copy the model's tensors into a fresh arena, seal it, and describe it."""
    tensors, aliases = model_tensors(model)
    entries: list[TensorEntry] = []
    cursor = 0
    for name, (tensor, kind) in tensors.items():
        if tensor.device.type != "cpu":
            raise WeightCacheError(f"{name} is on {tensor.device}; the cpu-shm arena holds CPU tensors only")
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
    arena = CpuShmArena(max(align(cursor), 1), label)
    try:
        flat = arena.buffer()
        views = tensor_views(flat, entries)
        with torch.no_grad():  # some of vLLM's parameters keep requires_grad=True
            for name, (tensor, _) in tensors.items():
                views[name].copy_(tensor)
        entries = [
            e.model_copy(update={"checksum": zlib.crc32(flat[e.offset : e.offset + e.nbytes].numpy())}) for e in entries
        ]
        arena.seal()
    except BaseException:
        arena.close()
        raise
    return Published(arena, Manifest.build(fingerprint_digest, arena.size, entries, aliases))


def _dense(tensor: torch.Tensor) -> bool:
    """No gaps and no overlaps: the tensor's elements fill exactly ``numel`` slots (any order)."""
    if tensor.numel() <= 1:
        return True
    span = 1 + sum((size - 1) * abs(step) for size, step in zip(tensor.shape, tensor.stride()))
    return span == tensor.numel() and all(step > 0 for size, step in zip(tensor.shape, tensor.stride()) if size > 1)
