"""Reading another process's ``/proc`` files when it may exit meanwhile, for the tests' helpers.

A process that exits between two reads (or during one) makes them fail in ways that differ by
the moment: ``FileNotFoundError`` once its directory is gone, ``ProcessLookupError`` (ESRCH) while
it is being torn down (``cmdline``, ``environ`` and ``fd/`` read its memory map and file table,
which go before the directory does), and an empty ``cmdline`` as a zombie. An fd listed in
``fd/`` may be closed before its link is read. Here each of those is "gone": the reader returns
None or leaves the entry out, and the caller decides what a vanished process means to it.
"""

from __future__ import annotations

import os
from pathlib import Path

GONE = (FileNotFoundError, ProcessLookupError, NotADirectoryError)
"""What reading a vanished process's (or a closed fd's) ``/proc`` entry raises."""


def read_proc(pid: int, name: str) -> bytes | None:
    """``/proc/<pid>/<name>``, or None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except GONE:
        return None


def argv(pid: int) -> list[bytes] | None:
    """The process's command line, or None when it is gone or a zombie (whose cmdline is empty)."""
    raw = read_proc(pid, "cmdline")
    return raw.rstrip(b"\0").split(b"\0") if raw else None


def children(pid: int) -> list[int]:
    """The pids of the process's children (of its main thread); none when it is gone."""
    raw = read_proc(pid, f"task/{pid}/children")
    return [int(p) for p in raw.split()] if raw else []


def alive(pid: int) -> bool:
    """Whether the process runs: it exists and is not a zombie."""
    raw = read_proc(pid, "stat")
    return raw is not None and raw.rsplit(b")", 1)[1].split()[0] != b"Z"


def fd_targets(pid: int) -> list[str]:
    """What each of the process's open fds points at, leaving out fds closed while being listed;
    none when the process is gone."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except GONE:
        return []
    targets = []
    for name in names:
        try:
            targets.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except GONE:
            continue
    return targets
