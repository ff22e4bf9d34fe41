"""The arena manifest: which tensor lives where inside a rank's one allocation.

On the wire the manifest is columnar — names as a list, every number as a packed little-endian
array — because an engine start must decode and check tens of thousands of entries in a few
milliseconds; a list of per-tensor maps costs ~10 µs per tensor in decoding and validation alone.
``TensorEntry`` is the row form the loader plans with and tests read.

The manifest is the only description an engine gets of the memory it maps, so the client checks
it (bounds, sizes, alignment, duplicates) before creating a single view: a buggy or hostile
daemon must not be able to make an engine read outside the arena.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict
from weightcache_contract.errors import ProtocolError

from ..gcpause import gc_paused
from . import dtypes

if TYPE_CHECKING:
    # Views need torch and checks need numpy; the daemon and keeper only move manifests, and
    # importing either would cost a re-adopting daemon a large part of its second (see dtypes.py).
    import numpy as np
    import torch

    from .tensor_index import TensorIndex

LAYOUT_VERSION = 1
# 256 bytes covers every dtype's alignment and the GPU backends' preferred access granule.
ALIGNMENT = 256
Kind = Literal["parameter", "buffer"]
KINDS: tuple[Kind, ...] = ("parameter", "buffer")


class TensorEntry(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    nbytes: int
    kind: Kind = "parameter"
    checksum: int = 0  # crc32 of the tensor's bytes, computed once by the daemon after post-processing


def _pack(values: list[int], dtype: str) -> bytes:
    import numpy as np

    return np.asarray(values, dtype=dtype).tobytes()


class Manifest(BaseModel):
    model_config = ConfigDict(frozen=True)

    layout_version: int = LAYOUT_VERSION
    fingerprint_digest: str
    arena_bytes: int
    names: list[str]
    dtype_names: list[str]  # the distinct dtypes; ``dtype_codes`` index into it
    dtype_codes: bytes  # uint8 per tensor
    ndims: bytes  # uint8 per tensor
    dims: bytes  # int64, all shapes concatenated
    strides: bytes  # int64, all strides concatenated
    offsets: bytes  # int64 per tensor
    nbytes: bytes  # int64 per tensor
    kinds: bytes  # uint8 per tensor, index into KINDS
    checksums: bytes  # uint32 per tensor
    # Tied weights: name → the entry it shares storage with (e.g. lm_head.weight → embed_tokens).
    aliases: dict[str, str] = {}
    # Shard file → the content digest of the bytes this rank read from it (checkpoints/content.py):
    # sliced (``sha256:``) from weightcache's loader, whole-file (``sha256-file:``) from the vLLM
    # profile's publisher; empty for a synthetic fill (and an older daemon's vLLM-profile arena).
    shard_digests: dict[str, str] = {}

    @classmethod
    def build(
        cls,
        fingerprint_digest: str,
        arena_bytes: int,
        entries: list[TensorEntry],
        aliases: dict[str, str] | None = None,
        shard_digests: dict[str, str] | None = None,
    ) -> Manifest:
        dtype_names = sorted({e.dtype for e in entries})
        code = {name: i for i, name in enumerate(dtype_names)}
        return cls(
            fingerprint_digest=fingerprint_digest,
            arena_bytes=arena_bytes,
            names=[e.name for e in entries],
            dtype_names=dtype_names,
            dtype_codes=_pack([code[e.dtype] for e in entries], "<u1"),
            ndims=_pack([len(e.shape) for e in entries], "<u1"),
            dims=_pack([d for e in entries for d in e.shape], "<i8"),
            strides=_pack([s for e in entries for s in e.stride], "<i8"),
            offsets=_pack([e.offset for e in entries], "<i8"),
            nbytes=_pack([e.nbytes for e in entries], "<i8"),
            kinds=_pack([KINDS.index(e.kind) for e in entries], "<u1"),
            checksums=_pack([e.checksum for e in entries], "<u4"),
            aliases=dict(aliases or {}),
            shard_digests=dict(shard_digests or {}),
        )

    def _columns(self) -> dict[str, np.ndarray]:
        import numpy as np

        cols = {
            "codes": np.frombuffer(self.dtype_codes, "<u1"),
            "ndims": np.frombuffer(self.ndims, "<u1"),
            "dims": np.frombuffer(self.dims, "<i8"),
            "strides": np.frombuffer(self.strides, "<i8"),
            "offsets": np.frombuffer(self.offsets, "<i8"),
            "nbytes": np.frombuffer(self.nbytes, "<i8"),
            "kinds": np.frombuffer(self.kinds, "<u1"),
            "checksums": np.frombuffer(self.checksums, "<u4"),
        }
        n = len(self.names)
        per_tensor = ("codes", "ndims", "offsets", "nbytes", "kinds", "checksums")
        if (
            any(len(cols[k]) != n for k in per_tensor)
            or len(cols["dims"]) != int(cols["ndims"].sum())
            or len(cols["strides"]) != len(cols["dims"])
        ):
            raise ProtocolError("manifest columns have inconsistent lengths")
        return cols

    def __len__(self) -> int:
        return len(self.names)

    def validate_bounds(self) -> None:
        """Reject a manifest whose entries escape the arena or contradict their own shapes."""
        import numpy as np

        if self.layout_version != LAYOUT_VERSION:
            raise ProtocolError(f"manifest layout version {self.layout_version} is not {LAYOUT_VERSION}")
        cols = self._columns()
        if cols["codes"].size and int(cols["codes"].max()) >= len(self.dtype_names):
            raise ProtocolError("manifest dtype code out of range")
        if cols["kinds"].size and int(cols["kinds"].max()) >= len(KINDS):
            raise ProtocolError("manifest tensor kind out of range")
        sizes = np.array([dtypes.itemsize(d) for d in self.dtype_names] or [1], dtype=np.int64)[cols["codes"]]
        if np.any(cols["dims"] < 0):
            raise ProtocolError("manifest has a negative dimension")
        # Element counts per tensor: product over each tensor's slice of ``dims`` (1 for scalars).
        starts = np.cumsum(cols["ndims"], dtype=np.int64) - cols["ndims"]
        logd = np.zeros(len(self.names), dtype=np.float64)
        counts = np.ones(len(self.names), dtype=np.int64)
        nonscalar = cols["ndims"] > 0
        if cols["dims"].size:
            counts[nonscalar] = np.multiply.reduceat(cols["dims"], starts[nonscalar])
            logd[nonscalar] = np.add.reduceat(np.log2(np.maximum(cols["dims"], 1)), starts[nonscalar])
        bad = (logd > 62) | (cols["nbytes"] != counts * sizes)
        bad |= (
            (cols["offsets"] < 0)
            | (cols["offsets"] % sizes != 0)
            | (cols["offsets"] + cols["nbytes"] > self.arena_bytes)
        )
        if np.any(bad):
            name = self.names[int(np.argmax(bad))]
            raise ProtocolError(
                f"manifest entry {name!r} lies outside the {self.arena_bytes}-byte arena "
                "or its nbytes/stride disagree with its shape"
            )
        if len(set(self.names)) != len(self.names):
            seen: set[str] = set()
            dup = next(n for n in self.names if n in seen or seen.add(n))  # type: ignore[func-returns-value]
            raise ProtocolError(f"manifest lists {dup!r} twice")
        names = set(self.names)
        for alias, target in self.aliases.items():
            if target not in names or alias in names:
                raise ProtocolError(f"manifest alias {alias!r} → {target!r} is inconsistent")

    def kinds_by_name(self) -> dict[str, str]:
        """name → "parameter" or "buffer", without building row-form entries."""
        return {name: KINDS[k] for name, k in zip(self.names, self._columns()["kinds"].tolist())}

    def entries(self) -> list[TensorEntry]:
        """Row form, for tests and tools; engines use ``views``."""
        cols = self._columns()
        out, pos = [], 0
        for i, name in enumerate(self.names):
            nd = int(cols["ndims"][i])
            out.append(
                TensorEntry(
                    name=name,
                    dtype=self.dtype_names[cols["codes"][i]],
                    shape=tuple(cols["dims"][pos : pos + nd].tolist()),
                    stride=tuple(cols["strides"][pos : pos + nd].tolist()),
                    offset=int(cols["offsets"][i]),
                    nbytes=int(cols["nbytes"][i]),
                    kind=KINDS[cols["kinds"][i]],
                    checksum=int(cols["checksums"][i]),
                )
            )
            pos += nd
        return out

    def index(self, arena: torch.Tensor) -> TensorIndex:
        """Name → zero-copy view into a flat uint8 arena, each view made on first lookup (call
        ``validate_bounds`` first). Costs a few list conversions, not a torch object per tensor."""
        import numpy as np

        from .tensor_index import TensorIndex

        cols = self._columns()
        starts = np.cumsum(cols["ndims"], dtype=np.int64) - cols["ndims"]
        return TensorIndex(
            _typed_bases(arena, self.dtype_names),
            self.names,
            cols["codes"],
            cols["ndims"],
            starts,
            cols["dims"],
            cols["strides"],
            cols["offsets"],
        )

    def views(self, arena: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every view at once (eager): what ``index`` makes one by one."""
        index = self.index(arena)
        with gc_paused():
            return {name: index[name] for name in self.names}


def _typed_bases(arena: torch.Tensor, dtype_names: list[str]) -> list[tuple[torch.Tensor, int]]:
    """One view of the whole arena per dtype; every tensor view is then a single ``as_strided``."""
    usable = arena.numel() // ALIGNMENT * ALIGNMENT
    bases = []
    for name in dtype_names:
        base = arena[:usable].view(dtypes.to_torch(name))
        bases.append((base, base.element_size()))
    return bases


def align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for dim in reversed(shape):
        stride.append(acc)
        acc *= dim
    return tuple(reversed(stride))


def tensor_views(arena: torch.Tensor, entries: list[TensorEntry]) -> dict[str, torch.Tensor]:
    """Views for row-form entries (the loader's plan); same mechanism as ``Manifest.views``."""
    import torch

    names = sorted({e.dtype for e in entries})
    typed = dict(zip(names, _typed_bases(arena, names)))
    return {
        e.name: torch.as_strided(typed[e.dtype][0], e.shape, e.stride, e.offset // typed[e.dtype][1]) for e in entries
    }
