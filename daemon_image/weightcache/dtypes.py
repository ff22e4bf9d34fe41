"""Names for tensor dtypes on the wire, in manifests and in fingerprints.

torch dtypes are not serialisable and their ``str()`` differs between versions, so every
place that crosses a process boundary uses these short, stable names instead.
"""

from __future__ import annotations

import torch

_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "float64": torch.float64,
}
_BY_DTYPE: dict[torch.dtype, str] = {dtype: name for name, dtype in _BY_NAME.items()}

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


def to_torch(name: str) -> torch.dtype:
    """The torch dtype for a wire name; unknown names are an error, never a guess."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(sorted(_BY_NAME))}") from None


def to_name(dtype: torch.dtype) -> str:
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot be cached; supported: {', '.join(sorted(_BY_NAME))}") from None


def itemsize(name: str) -> int:
    return to_torch(name).itemsize
