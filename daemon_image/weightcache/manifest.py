"""The arena manifest: which tensor lives where inside a rank's one allocation.

The manifest is the only description an engine gets of the memory it maps, so the client checks
it (bounds, sizes, alignment) before creating a single view: a buggy or hostile daemon must not
be able to make an engine read outside the arena.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict

from . import dtypes
from .errors import ProtocolError

LAYOUT_VERSION = 1
# 256 bytes covers every dtype's alignment and the GPU backends' preferred access granule.
ALIGNMENT = 256


class TensorEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int
    kind: Literal["parameter", "buffer"] = "parameter"
    checksum: int = 0  # crc32 of the tensor's bytes, computed once by the daemon after post-processing


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True)

    layout_version: int = LAYOUT_VERSION
    fingerprint_digest: str
    arena_bytes: int
    tensors: tuple[TensorEntry, ...]
    # Tied weights: name → the entry it shares storage with (e.g. lm_head.weight → embed_tokens).
    aliases: dict[str, str] = {}

    def validate_bounds(self) -> None:
        """Reject a manifest whose entries escape the arena or contradict their own shapes."""
        if self.layout_version != LAYOUT_VERSION:
            raise ProtocolError(f"manifest layout version {self.layout_version} is not {LAYOUT_VERSION}")
        names = set()
        for e in self.tensors:
            size = dtypes.itemsize(e.dtype)
            if e.nbytes != size * math.prod(e.shape) or len(e.stride) != len(e.shape):
                raise ProtocolError(f"manifest entry {e.name!r}: nbytes/stride disagree with shape {e.shape}")
            if e.offset < 0 or e.offset % size or e.offset + e.nbytes > self.arena_bytes:
                raise ProtocolError(f"manifest entry {e.name!r} lies outside the {self.arena_bytes}-byte arena")
            if e.name in names:
                raise ProtocolError(f"manifest lists {e.name!r} twice")
            names.add(e.name)
        for alias, target in self.aliases.items():
            if target not in names or alias in names:
                raise ProtocolError(f"manifest alias {alias!r} → {target!r} is inconsistent")


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.append(acc)
        acc *= dim
    return tuple(reversed(stride))


def tensor_views(arena: torch.Tensor, entries: tuple[TensorEntry, ...] | list[TensorEntry]) -> dict[str, torch.Tensor]:
    """Views into a flat uint8 arena, one per entry, without copying.

    One typed view of the whole arena per dtype, then one ``as_strided`` per tensor: creating
    twenty thousand views costs a few tens of milliseconds this way.
    """
    typed: dict[str, torch.Tensor] = {}
    views: dict[str, torch.Tensor] = {}
    usable = arena.numel() // ALIGNMENT * ALIGNMENT
    for e in entries:
        base = typed.get(e.dtype)
        if base is None:
            base = typed[e.dtype] = arena[:usable].view(dtypes.to_torch(e.dtype))
        views[e.name] = torch.as_strided(base, e.shape, e.stride, e.offset // base.element_size())
    return views
