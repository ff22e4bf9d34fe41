"""Name → zero-copy view of one arena, each view made the first time it is looked up.

An engine that binds a rank of 20,000 tensors would otherwise create 20,000 ``as_strided``
views (~2 µs each) before its first forward, most of them for layers that run much later. The
index holds the manifest's columns as plain lists and one typed view of the arena per dtype;
``index[name]`` makes that tensor's view (one ``as_strided`` over its dtype's base, the same
call the eager path makes) and keeps it, so later lookups return the same object. Names,
shapes and dtypes are answered from the columns without creating any tensor (``spec``), which
is what lets a model check every name and shape at bind time and defer the views to first use.

Views are read-only exactly when the arena's memory is: they share its mapping.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import torch


class TensorSpec(NamedTuple):
    """What a tensor will be, without the tensor: enough for a model to check its place."""

    shape: tuple[int, ...]
    dtype: torch.dtype


class TensorIndex(Mapping[str, "torch.Tensor"]):
    """A read-only mapping name → view; see the module docstring. Build with ``Manifest.index``."""

    def __init__(
        self,
        bases: list[tuple[torch.Tensor, int]],
        names: list[str],
        codes: np.ndarray,
        ndims: np.ndarray,
        starts: np.ndarray,
        dims: np.ndarray,
        strides: np.ndarray,
        offsets: np.ndarray,
    ) -> None:
        self._bases = bases  # per dtype code: (typed view of the whole arena, element size)
        self._names = names
        self._pos = dict(zip(names, range(len(names))))
        self._columns = (codes, ndims, starts, dims)  # numpy, for checks over many tensors at once
        # Python lists for the per-view path: indexing them costs less than numpy scalars.
        self._codes, self._ndims, self._starts = codes.tolist(), ndims.tolist(), starts.tolist()
        self._dims, self._strides, self._offsets = dims.tolist(), strides.tolist(), offsets.tolist()
        self._views: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        view = self._views.get(name)
        if view is None:
            i = self._pos[name]
            base, size = self._bases[self._codes[i]]
            start, stop = self._starts[i], self._starts[i] + self._ndims[i]
            view = base.as_strided(self._dims[start:stop], self._strides[start:stop], self._offsets[i] // size)
            self._views[name] = view
        return view

    def get(self, name: str, default: torch.Tensor | None = None) -> torch.Tensor | None:  # type: ignore[override]
        # Mapping's own ``get`` catches a KeyError per miss; eager binding calls this per tensor.
        return self[name] if name in self._pos else default

    def __contains__(self, name: object) -> bool:
        return name in self._pos

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def spec(self, name: str) -> TensorSpec:
        """Shape and dtype of ``name`` from the manifest; creates no tensor (KeyError if absent)."""
        i = self._pos[name]
        start = self._starts[i]
        return TensorSpec(tuple(self._dims[start : start + self._ndims[i]]), self._bases[self._codes[i]][0].dtype)

    def first_unlike(self, names: list[str], like: str) -> str | None:
        """The first of ``names`` that is absent or differs from ``like`` in shape or dtype, if any;
        creates no tensor (one dict lookup per name, the comparisons column-wise)."""
        import numpy as np

        found = list(map(self._pos.get, names))
        if None in found:
            return names[found.index(None)]
        codes, ndims, starts, dims = self._columns
        i = self._pos[like]
        at = np.asarray(found, dtype=np.int64)
        bad = (codes[at] != codes[i]) | (ndims[at] != ndims[i])
        if not bad.any():  # same rank everywhere: compare each dimension
            for d in range(int(ndims[i])):
                bad |= dims[starts[at] + d] != dims[starts[i] + d]
        return names[int(np.argmax(bad))] if bad.any() else None

    @property
    def materialised(self) -> int:
        """How many views exist so far."""
        return len(self._views)
