"""Names for tensor dtypes on the wire, in manifests and in fingerprints.

torch dtypes are not serialisable and their ``str()`` differs between versions, so every
place that crosses a process boundary uses these short, stable names instead.

torch is imported only by the functions that return torch dtypes: a daemon re-adopting its
arena from the keeper reads headers and sizes but never touches a tensor, and importing torch
would cost it seconds of its sub-second restart.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ITEMSIZE: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float64": 8,
}

# safetensors header dtype codes → our names.
SAFETENSORS_DTYPES: dict[str, str] = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "F64": "float64",
}

FLOATING_COMPUTE_DTYPES = ("float32", "float16", "bfloat16")


@functools.cache
def _by_name() -> dict[str, torch.dtype]:
    import torch

    return {name: getattr(torch, name) for name in ITEMSIZE}


@functools.cache
def _by_dtype() -> dict[torch.dtype, str]:
    return {dtype: name for name, dtype in _by_name().items()}


def to_torch(name: str) -> torch.dtype:
    """The torch dtype for a wire name; unknown names are an error, never a guess."""
    try:
        return _by_name()[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(ITEMSIZE))}") from None


def to_name(dtype: torch.dtype) -> str:
    try:
        return _by_dtype()[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot be cached; supported: {', '.join(sorted(ITEMSIZE))}") from None


def itemsize(name: str) -> int:
    try:
        return ITEMSIZE[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(ITEMSIZE))}") from None
