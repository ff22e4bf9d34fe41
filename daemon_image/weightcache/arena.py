"""Arenas: one shared allocation per rank that holds every tensor of that rank.

One handle to open instead of thousands keeps an engine's mapping cost flat as tensor counts
grow. This module has the daemon side (create, fill, seal, export) and the engine side (map a
received fd read-only). Backends share this interface; ``cpu-shm`` is a memfd.
"""

from __future__ import annotations

import abc
import fcntl
import mmap
import os
import warnings

import torch

from .errors import WeightCacheError

# Linux ≥ 5.1: forbids new writable mappings while the daemon keeps the one it filled through.
F_SEAL_FUTURE_WRITE = 0x0010
# Linux ≥ 5.14: fault in a whole range at once; several times faster than first-touch faults.
MADV_POPULATE_WRITE = 23


class Arena(abc.ABC):
    """The daemon's view of a rank's allocation."""

    backend: str
    size: int

    @abc.abstractmethod
    def buffer(self) -> torch.Tensor:
        """The whole arena as a writable flat uint8 tensor, for filling."""

    @abc.abstractmethod
    def seal(self) -> None:
        """Freeze the contents: after this nobody, engines included, can write them."""

    @abc.abstractmethod
    def export_fd(self) -> int:
        """A new fd to send to an engine; the caller closes it after sending."""

    @abc.abstractmethod
    def close(self) -> None: ...


class CpuShmArena(Arena):
    backend = "cpu-shm"

    def __init__(self, size: int, label: str) -> None:
        self.size = size
        self.fd = os.memfd_create(f"weightcache:{label}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size)
            # Allocate the pages now: fails fast with ENOSPC if shared memory is short, instead of a
            # SIGBUS halfway through loading.
            os.posix_fallocate(self.fd, 0, size)
            self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(self.fd)
            raise WeightCacheError(f"cannot allocate a {size}-byte shared arena: {exc}; free memory or raise "
                                   "the shared-memory limit (/dev/shm size, memory cgroup)") from None
        try:
            self._map.madvise(MADV_POPULATE_WRITE)
        except OSError:
            pass  # older kernel: pages fault in as the loader writes them
        self._buffer = torch.frombuffer(self._map, dtype=torch.uint8, count=size)

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def seal(self) -> None:
        seals = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, seals)

    def export_fd(self) -> int:
        # A read-only open of the same memfd: an engine cannot even ask for a writable mapping.
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    def close(self) -> None:
        self._buffer = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:
            pass  # views still alive; the mapping goes away with the process
        os.close(self.fd)


BACKENDS: dict[str, type[Arena]] = {"cpu-shm": CpuShmArena}


def create_arena(backend: str, size: int, label: str) -> Arena:
    try:
        cls = BACKENDS[backend]
    except KeyError:
        raise WeightCacheError(f"backend {backend!r} is not available here; available: {', '.join(BACKENDS)}") from None
    return cls(size, label)


class MappedArena:
    """The engine's read-only mapping of an arena it received as an fd."""

    def __init__(self, fd: int, size: int, backend: str) -> None:
        if backend != "cpu-shm":
            raise WeightCacheError(f"this client cannot map backend {backend!r}")
        actual = os.fstat(fd).st_size
        if actual < size:
            raise WeightCacheError(f"received arena is {actual} bytes, manifest says {size}")
        self.size = size
        self.backend = backend
        self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        with warnings.catch_warnings():
            # torch warns that the buffer is not writable: that is the point.
            warnings.simplefilter("ignore", UserWarning)
            self.buffer = torch.frombuffer(self._map, dtype=torch.uint8, count=size)

    @property
    def address_range(self) -> tuple[int, int]:
        base = self.buffer.data_ptr()
        return base, base + self.size
