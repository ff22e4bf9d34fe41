"""Finds processes a test session left behind, by an environment marker they all inherit.

Every process the session starts (the control plane and its components, every container)
carries ``WEIGHTCACHE_TEST_SESSION=<id>`` in its environment; after teardown, any live process
still carrying the id is a leak, whatever process group or parent it ended up with.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

MARKER = "WEIGHTCACHE_TEST_SESSION"


def new_session_id() -> str:
    return uuid.uuid4().hex


def marked_processes(session_id: str) -> dict[int, str]:
    """pid → command line of every live process carrying the session's marker."""
    return processes_with_environment(MARKER, session_id)


def processes_with_environment(key: str, value: str) -> dict[int, str]:
    """pid → command line of every live, non-zombie process whose environment has key=value."""
    needle = f"{key}={value}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            status = (entry / "stat").read_text()
            if status.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds no resources; its parent reaps it
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return found


def kill_all(pids: dict[int, str]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
