"""What an engine's model maps from the cache (vLLM: for ``LLM.apply_model``, so it must be importable)."""

from __future__ import annotations

from typing import Any

from torch import nn

from .bind import Bound, outside_mapping


def zero_copy_report(model: nn.Module) -> dict[str, Any]:
    """``mode`` and the worker's memory; for a mapped model also the arena's range and every
    tensor whose bytes lie outside it."""
    memory = memory_kib()
    weights = getattr(model, "_weightcache_weights", None)
    if weights is None:
        return {"mode": "disk", "memory_kib": memory}
    start, end = weights.arena.address_range
    bound: Bound = model._weightcache_bound  # type: ignore[assignment]
    return {
        "mode": "cache",
        "arena_bytes": end - start,
        "tensors": len(weights.tensors),
        "aliases": len(weights.aliases),
        "private": bound.private,
        "private_bytes": bound.private_bytes,
        "outside": outside_mapping(model, start, end),
        "memory_kib": memory,
    }


def memory_kib(pid: int | str = "self") -> dict[str, int]:
    """A process's VmRSS split into RssAnon (private) / RssFile / RssShmem (the arena's pages it
    touched: what vLLM's CPU worker sees as its RSS), and Pss / Pss_Shmem (its fair share of pages
    other processes map too), in KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(value.split()[0])
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Pss", "Pss_Shmem"):
                out[key] = int(value.split()[0])
    return out
