"""The page cache: dropping a file's pages (to measure cold reads without root-only knobs) and
asking the kernel to read ranges ahead (so a daemon's disk works while it imports torch)."""

from __future__ import annotations

import os
from pathlib import Path


def drop_page_cache(path: str | os.PathLike[str]) -> bool:
    """posix_fadvise(DONTNEED) on every file under ``path``; True if the kernel accepted all.

    DONTNEED drops clean, unmapped pages only, which is what a checkpoint's are between runs.
    """
    root = Path(path)
    files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    ok = True
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


def prefetch(ranges: list[tuple[str, int, int]], budget_bytes: int) -> int:
    """posix_fadvise(WILLNEED) over (path, offset, length) ranges in order, up to ``budget_bytes``;
    returns the bytes asked for. The kernel reads them in the background; a later ``pread`` of
    those bytes copies from memory. Errors are ignored: this only ever saves time."""
    asked = 0
    fds: dict[str, int] = {}
    try:
        for path, offset, length in ranges:
            if asked >= budget_bytes:
                break
            length = min(length, budget_bytes - asked)
            fd = fds.get(path)
            if fd is None:
                try:
                    fd = fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    continue
            try:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
            except OSError:
                continue
            asked += length
    finally:
        for fd in fds.values():
            os.close(fd)
    return asked


def available_memory() -> int:
    """MemAvailable from /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0
