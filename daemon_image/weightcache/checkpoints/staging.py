"""Pinned host buffers for copies between host memory and a GPU, one buffer and one stream per thread.

A copy between a GPU and pageable host memory goes through the driver's own small pinned buffer, one
piece at a time, and holds the copying thread for all of it; from or into a pinned buffer it runs at
the link's speed on the thread's own stream. Threads that each own a buffer keep several copies in
flight while others read files, copy between host buffers or sum bytes (all of which let go of the
GIL), which is how the loader uploads a checkpoint and how a publish moves an arena's bytes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importers that plan without torch (the loader's module) import this one too
    import torch

STAGING_BYTES = 64 * 2**20
"""One thread's buffer: large enough that a copy's fixed cost is small, small enough for 16 threads."""


class PinnedStaging:
    """Each calling thread's pinned buffer and stream on ``device``, made on its first use."""

    def __init__(self, device: torch.device, nbytes: int = STAGING_BYTES) -> None:
        self.device = device
        self.nbytes = nbytes
        self._local = threading.local()

    def get(self) -> tuple[torch.Tensor, memoryview, torch.cuda.Stream]:
        """This thread's buffer, the same bytes as a memoryview (for preads and crc32), and its stream."""
        import torch

        local = self._local
        if not hasattr(local, "buffer"):
            local.buffer = torch.empty(self.nbytes, dtype=torch.uint8, pin_memory=True)
            local.view = local.buffer.numpy().data
            local.stream = torch.cuda.Stream(self.device)  # type: ignore[no-untyped-call]
        return local.buffer, local.view, local.stream

    def to_host(self, src: torch.Tensor) -> torch.Tensor:
        """``src`` (flat uint8 on the GPU, at most ``nbytes``) copied into this thread's buffer; the
        result is that buffer, valid until this thread's next call. Work queued on other streams that
        writes ``src`` must be finished first (the caller synchronises)."""
        import torch

        buffer, _, stream = self.get()
        n = src.numel()
        with torch.cuda.stream(stream):
            buffer[:n].copy_(src, non_blocking=True)
        stream.synchronize()
        return buffer[:n]

    def to_device(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Host ``src`` into GPU ``dst`` (flat uint8, at most ``nbytes``) through this thread's buffer;
        done when this returns."""
        import torch

        buffer, _, stream = self.get()
        n = src.numel()
        buffer[:n].copy_(src)
        with torch.cuda.stream(stream):
            dst.copy_(buffer[:n], non_blocking=True)
        stream.synchronize()  # the buffer is reused by this thread's next call
