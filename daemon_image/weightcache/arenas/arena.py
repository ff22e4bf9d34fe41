"""Arenas: one allocation per rank that holds every tensor of that rank.

One handle to open instead of thousands keeps an engine's mapping cost flat as tensor counts
grow. Three backends share one interface:

- ``cpu-shm``: a memfd, sealed after loading and handed out as a read-only fd.
- ``cuda-vmm``: one ``cuMemCreate`` allocation exported as a POSIX fd (see ``cuda_arena``).
- ``cuda-ipc``: one legacy CUDA IPC handle, for engines built around ``rebuild_cuda_tensor``.

Daemons create (or re-adopt from the keeper) an ``Arena``; engines get a ``MappedArena``.
fd-based backends can be held by the keeper, which is what lets a cache outlive its daemon.

Re-adoption imports neither torch nor CUDA into the daemon: an adopted arena is an fd the daemon
passes on, never writes, so a restarted daemon serves again within a second instead of paying
seconds for ``import torch`` and a CUDA context it would not use.
"""

from __future__ import annotations

import abc
import fcntl
import mmap
import os
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import WeightCacheError

from ..wire.protocol import CudaIpcHandle

if TYPE_CHECKING:
    import torch

# Linux ≥ 5.1: forbids new writable mappings while the daemon keeps the one it filled through.
F_SEAL_FUTURE_WRITE = 0x0010
# Linux ≥ 5.14: fault in a whole range at once; several times faster than first-touch faults.
MADV_POPULATE_WRITE = 23
Access = Literal["read-only", "read-write"]


@dataclass
class Export:
    """What travels to an engine: an fd (fd backends) or an IPC handle."""

    fd: int | None = None
    ipc: CudaIpcHandle | None = None


class Arena(abc.ABC):
    """The daemon's side of a rank's allocation."""

    backend: str
    size: int  # bytes the plan needs
    mapping_bytes: int  # bytes allocated (≥ size: GPU allocations round up to their granularity)
    device_uuid: str | None = None

    @abc.abstractmethod
    def buffer(self) -> torch.Tensor:
        """The whole arena as a flat uint8 tensor on its device (writable until sealed)."""

    # Not abstract: a backend that cannot freeze its memory keeps this no-op.
    def seal(self) -> None:  # noqa: B027
        """Freeze the contents where the backend can enforce it."""

    @abc.abstractmethod
    def export(self) -> Export:
        """A fresh fd (closed by the caller after sending) or an IPC handle."""

    def handoff_fd(self) -> int:
        """The fd that alone keeps this arena's memory alive (no mapping, no CUDA context needed),
        for a process that passes the arena on across ``exec`` (daemon/handoff.py)."""
        raise WeightCacheError(
            f"a {self.backend} arena has no fd that outlives this process's CUDA context; "
            "it cannot be handed across exec (use cpu-shm or cuda-vmm)"
        )

    @abc.abstractmethod
    def close(self) -> None: ...


class CpuShmArena(Arena):
    backend = "cpu-shm"

    def __init__(self, size: int, label: str, fd: int | None = None) -> None:
        self.size = self.mapping_bytes = size
        self._buffer: torch.Tensor | None = None
        if fd is not None:  # adopted from the keeper: already filled and sealed
            self.fd = fd
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            return
        self.fd = os.memfd_create(f"weightcache:{label}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            # Allocate the pages now: fails fast with ENOSPC if shared memory is short, instead of a
            # SIGBUS halfway through loading.
            os.posix_fallocate(self.fd, 0, size)
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            raise WeightCacheError(
                f"cannot allocate a {size}-byte shared arena: {exc}; free memory or raise "
                "the shared-memory limit (/dev/shm size, memory cgroup)"
            ) from None
        try:
            self._map.madvise(MADV_POPULATE_WRITE)
        except OSError:
            pass  # older kernel: pages fault in as the loader writes them
        self._buffer = _frombuffer(self._map, size)

    def buffer(self) -> torch.Tensor:
        if self._buffer is None:  # adopted: made on first use only (tests and tools read it back)
            self._buffer = _frombuffer(self._map, self.size)
        return self._buffer

    def seal(self) -> None:
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)

    def handoff_fd(self) -> int:
        return self.fd

    def export(self) -> Export:
        # A read-only open of the same memfd: an engine cannot even ask for a writable mapping.
        return Export(fd=os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC))

    def close(self) -> None:
        self._buffer = None
        try:
            self._map.close()
        except BufferError:
            pass  # views still alive; the mapping goes away with the process
        os.close(self.fd)


class HeldFdArena(Arena):
    """A ``cuda-vmm`` arena re-adopted from the keeper, held as its exported fd and nothing more.

    The fd keeps the allocation alive and is all an engine needs; the daemon never writes an
    adopted arena, so it neither imports the allocation into CUDA nor creates a context.
    """

    backend = "cuda-vmm"

    def __init__(self, fd: int, size: int, mapping_bytes: int, device_uuid: str | None) -> None:
        self._fd = fd
        self.size = size
        self.mapping_bytes = mapping_bytes
        self.device_uuid = device_uuid

    def buffer(self) -> torch.Tensor:
        raise WeightCacheError("an arena re-adopted from the keeper is held by fd only and is never written again")

    def export(self) -> Export:
        return Export(fd=os.dup(self._fd))

    def handoff_fd(self) -> int:
        return self._fd

    def close(self) -> None:
        os.close(self._fd)


def _frombuffer(buf: mmap.mmap, size: int) -> torch.Tensor:
    import torch

    with warnings.catch_warnings():
        # torch warns that the buffer is not writable: that is the point.
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(buf, dtype=torch.uint8, count=size)


def create_arena(backend: str, size: int, label: str, device: int = 0) -> Arena:
    if backend == "cpu-shm":
        return CpuShmArena(size, label)
    if backend in GPU_BACKENDS:
        from . import cuda_arena

        return cuda_arena.create(backend, size, device)
    raise WeightCacheError(f"backend {backend!r} is unknown; known: cpu-shm, {', '.join(GPU_BACKENDS)}")


def adopt_arena(backend: str, fd: int, size: int, mapping_bytes: int, device_uuid: str | None) -> Arena:
    """Take over an arena the keeper held: no allocation, no loading; owns ``fd`` from now on."""
    if backend == "cpu-shm":
        return CpuShmArena(size, "adopted", fd=fd)
    if backend == "cuda-vmm":
        return HeldFdArena(fd, size, mapping_bytes, device_uuid)
    raise WeightCacheError(f"backend {backend!r} cannot be held by the keeper (it has no fd)")


class MappedArena:
    """The engine's mapping of an arena; ``buffer`` is a flat uint8 tensor on the arena's device."""

    buffer: torch.Tensor
    size: int
    backend: str
    device_uuid: str | None = None

    @property
    def address_range(self) -> tuple[int, int]:
        base = self.buffer.data_ptr()
        return base, base + self.size


class CpuShmMapping(MappedArena):
    backend = "cpu-shm"

    def __init__(self, fd: int, size: int) -> None:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise WeightCacheError(f"received arena is {actual} bytes, manifest says {size}")
        self.size = size
        self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        self.buffer = _frombuffer(self._map, size)


def map_arena(
    backend: str,
    size: int,
    mapping_bytes: int,
    fd: int | None,
    ipc: CudaIpcHandle | None,
    device_uuid: str | None,
    access: Access = "read-only",
) -> MappedArena:
    """Map what a daemon sent; the caller closes ``fd`` afterwards (the mapping keeps the memory)."""
    if backend == "cpu-shm":
        if fd is None:
            raise WeightCacheError("cpu-shm fetch reply carried no fd")
        if access != "read-only":
            raise WeightCacheError("cpu-shm arenas are sealed; only read-only mappings exist")
        return CpuShmMapping(fd, size)
    if backend in GPU_BACKENDS:
        from . import cuda_arena

        return cuda_arena.map_for_engine(backend, size, mapping_bytes, fd, ipc, device_uuid, access)
    raise WeightCacheError(f"this client cannot map backend {backend!r}")
