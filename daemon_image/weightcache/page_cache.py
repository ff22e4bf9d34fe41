"""Dropping a file's pages from the page cache, to measure cold reads without root-only knobs."""

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
