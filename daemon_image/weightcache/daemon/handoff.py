"""Hand a sealed ``cpu-shm`` arena from a publisher process to a torch-free daemon, across ``exec``.

A publisher that ran a whole engine to fill an arena (the ``vllm`` profile runs vLLM's loader)
keeps that engine's libraries resident: ~1 GB for vLLM on CPU, whatever the model. Instead of
serving itself it ``exec``s into ``weightcache daemon`` with the same flags plus
``--handoff-state FILE``: the arena's memfd and the rank's flock'ed lock fd survive the exec (same
pid, so the lock is never free and no second daemon can slip in), the manifest and fingerprint
travel in the state file, and the new image serves through the reference daemon's path
(``rank.serve``): ready file, peer checks, keeper deposit, status. Measured with vLLM 0.32: ~1 GB
RSS before the exec, 34 MB after.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import NoReturn

import msgpack
from pydantic import BaseModel

from ..checkpoints.manifest import Manifest
from ..wire.fingerprint import Fingerprint

HANDOFF_FLAG = "--handoff-state"


class HandoffState(BaseModel):
    fingerprint: Fingerprint
    manifest: Manifest
    arena_fd: int
    mapping_bytes: int
    lock_fd: int
    load_seconds: float
    disk_bytes_read: int
    adopted: bool  # withdrawn from the keeper rather than loaded


def exec_daemon(state: HandoffState, daemon_argv: list[str]) -> NoReturn:
    """Replace this process by ``weightcache daemon <daemon_argv> --handoff-state FILE``; never returns.

    ``daemon_argv`` is the rank's own flags (``sys.argv[2:]`` of a ``weightcache daemon`` process),
    so the serving image runs with exactly the socket dir, name, peers and keeper it was given."""
    if HANDOFF_FLAG in daemon_argv:
        raise ValueError(f"{HANDOFF_FLAG} is set by the publisher itself; do not pass it")
    fd, path = tempfile.mkstemp(prefix="weightcache-handoff-", suffix=".msgpack")
    with os.fdopen(fd, "wb") as f:
        f.write(msgpack.packb(state.model_dump(mode="python")))
    os.set_inheritable(state.arena_fd, True)
    os.set_inheritable(state.lock_fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "weightcache", "daemon", *daemon_argv, HANDOFF_FLAG, path])


def read_state(path: str) -> HandoffState:
    """The state a publisher left for this process; the file is removed once read."""
    with open(path, "rb") as f:
        raw = msgpack.unpackb(f.read())
    os.unlink(path)
    return HandoffState.model_validate(raw)
