"""What the binding tests mean by "the same view": one tensor object or another over the same bytes."""

from __future__ import annotations

import torch


def same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same bytes (data pointer and storage), seen the same way (shape, stride, dtype)."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
        and a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    )
