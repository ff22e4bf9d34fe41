"""An arena's bytes as the seed transport reads and writes them.

A host arena (cpu-shm) is one memoryview: the server sends straight from it and the client
receives straight into it, so no byte is staged or copied on either side. A GPU arena passes
through a host staging buffer of one chunk per stream (a TCP socket reads and writes host
memory); that copy is the seam where an RDMA or NCCL transport would move device memory
directly, and is not built (docs/operations.md says so).
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from ..arenas.arena import Arena


HASH_THREADS = max(1, min(4, (os.cpu_count() or 2) // 2))
"""Threads hashing an arena's chunks (hashlib releases the GIL): at most half the cores, so a
serving peer's engines keep the rest while it hashes for its first seed."""


def chunk_spans(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) of each chunk of an arena of ``size`` bytes."""
    return [(offset, min(chunk_bytes, size - offset)) for offset in range(0, size, chunk_bytes)]


class ArenaBytes:
    """Chunk-sized windows onto one arena's first ``size`` bytes."""

    def __init__(self, arena: Arena, size: int) -> None:
        self.size = size
        self._buffer: torch.Tensor = arena.buffer()
        self._host: memoryview | None = None
        if self._buffer.device.type == "cpu":
            self._host = self._buffer.numpy().data.cast("B")

    @property
    def on_host(self) -> bool:
        return self._host is not None

    def readable(self, offset: int, length: int, staging: torch.Tensor | None = None) -> memoryview:
        """The bytes at ``offset``: a view of a host arena, or a copy into ``staging`` from a GPU's."""
        if self._host is not None:
            return self._host[offset : offset + length]
        assert staging is not None
        staging[:length].copy_(self._buffer[offset : offset + length])
        return staging.numpy().data.cast("B")[:length]

    def writable(self, offset: int, length: int, staging: torch.Tensor | None = None) -> memoryview:
        """Where the bytes for ``offset`` are received: the arena itself on the host, else ``staging``
        (then ``commit`` copies them to the device)."""
        if self._host is not None:
            return self._host[offset : offset + length]
        assert staging is not None
        return staging.numpy().data.cast("B")[:length]

    def commit(self, offset: int, length: int, staging: torch.Tensor | None) -> None:
        if self._host is None:
            assert staging is not None
            self._buffer[offset : offset + length].copy_(staging[:length])

    def staging(self, chunk_bytes: int) -> torch.Tensor | None:
        """A pinned host buffer for a GPU arena; None for a host one (it needs none)."""
        if self._host is not None:
            return None
        import torch

        return torch.empty(chunk_bytes, dtype=torch.uint8, pin_memory=True)

    def digests(self, chunk_bytes: int, threads: int = HASH_THREADS) -> list[str]:
        """SHA-256 of each chunk, as the server offers them; ``threads`` chunks at a time (a GPU
        arena's through one staging buffer per thread)."""
        local = threading.local()

        def one(span: tuple[int, int]) -> str:
            if not hasattr(local, "staging"):
                local.staging = self.staging(chunk_bytes)
            return hashlib.sha256(self.readable(*span, local.staging)).hexdigest()

        spans = chunk_spans(self.size, chunk_bytes)
        if threads <= 1:
            return [one(span) for span in spans]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="seed-hash") as pool:
            return list(pool.map(one, spans))
