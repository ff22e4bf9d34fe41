"""Hand a sealed arena from a publisher process to a torch-free daemon, across ``exec``.

A publisher that ran a whole engine to fill an arena (the ``vllm`` profile runs vLLM's loader)
keeps that engine's libraries resident: ~1 GB for vLLM on CPU, whatever the model. Instead of
serving itself it ``exec``s into ``weightcache daemon`` with the same flags plus
``--handoff-state FILE``: the arena's memfd and the rank's flock'ed lock fd survive the exec (same
pid, so the lock is never free and no second daemon can slip in), the manifest and fingerprint
travel in the state file, and the new image serves through the reference daemon's path
(``rank.serve``): ready file, peer checks, keeper deposit, status. Measured with vLLM 0.32: ~1 GB
RSS before the exec, 34 MB after.

The arena travels as the one fd that keeps its memory alive without a mapping
(``Arena.handoff_fd``): the memfd for ``cpu-shm``; for ``cuda-vmm`` the cuMem allocation's
exported POSIX fd, which outlives the publisher's CUDA context as it outlives a daemon's when the
keeper holds it. Every other descriptor is closed by the exec, the CUDA driver's device files
included, so the publisher's context, its model copy and its process groups die with the old
image. ``cuda-ipc`` has no such fd (a legacy IPC handle names memory of the exporting context)
and is refused.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import NoReturn

import msgpack
from pydantic import BaseModel
from weightcache_contract.launch import DaemonArgs
from weightcache_contract.seeding import SeedReport

from ..arenas.arena import Arena
from ..checkpoints.manifest import Manifest
from ..wire.fingerprint import Fingerprint


class HandoffState(BaseModel):
    fingerprint: Fingerprint
    manifest: Manifest
    backend: str
    arena_fd: int
    mapping_bytes: int
    device_uuid: str | None  # GPU backends: the GPU the allocation lives on
    lock_fd: int
    load_seconds: float
    disk_bytes_read: int
    adopted: bool  # withdrawn from the keeper rather than loaded
    seed: SeedReport | None = None  # the rank asked peers (daemon/serving.py's ``Served.seed``)
    chunk_digests: list[str] | None = None  # a seed's verified chunk digests


def handoff_state(
    arena: Arena,
    manifest: Manifest,
    fingerprint: Fingerprint,
    *,
    lock_fd: int,
    load_seconds: float,
    disk_bytes_read: int,
    adopted: bool,
    seed: SeedReport | None = None,
    chunk_digests: list[str] | None = None,
) -> HandoffState:
    """What the serving image needs of ``arena`` (filled and sealed, or withdrawn from the keeper)."""
    return HandoffState(
        fingerprint=fingerprint,
        manifest=manifest,
        backend=arena.backend,
        arena_fd=arena.handoff_fd(),
        mapping_bytes=arena.mapping_bytes,
        device_uuid=arena.device_uuid,
        lock_fd=lock_fd,
        load_seconds=load_seconds,
        disk_bytes_read=disk_bytes_read,
        adopted=adopted,
        seed=seed,
        chunk_digests=chunk_digests,
    )


def exec_daemon(state: HandoffState, daemon: DaemonArgs) -> NoReturn:
    """Replace this process by ``weightcache daemon`` with ``daemon``'s flags and the state file as
    its ``handoff_state``; never returns.

    ``daemon`` is the rank's own flags, so the serving image runs with exactly the socket dir,
    name, peers and keeper it was given."""
    if daemon.handoff_state is not None:
        raise ValueError("the handoff state is set by the publisher itself; do not pass it")
    fd, path = tempfile.mkstemp(prefix="weightcache-handoff-", suffix=".msgpack")
    with os.fdopen(fd, "wb") as f:
        f.write(msgpack.packb(state.model_dump(mode="python")))
    _close_on_exec_all_but({0, 1, 2, state.arena_fd, state.lock_fd})
    os.set_inheritable(state.arena_fd, True)
    os.set_inheritable(state.lock_fd, True)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = daemon.but(handoff_state=path).to_argv()
    os.execv(sys.executable, [sys.executable, "-m", "weightcache", "daemon", *argv])


def _close_on_exec_all_but(keep: set[int]) -> None:
    """Mark every other open descriptor close-on-exec. A library may open one without the flag
    (a process group's socket, a driver's file); an inherited ``/dev/nvidia*`` fd would keep the
    publisher's CUDA context, and with it the model it loaded, alive in the new image."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in keep:
            continue
        try:
            os.set_inheritable(fd, False)
        except OSError:
            pass  # the directory's own fd, closed by now


def read_state(path: str) -> HandoffState:
    """The state a publisher left for this process; the file is removed once read."""
    with open(path, "rb") as f:
        raw = msgpack.unpackb(f.read())
    os.unlink(path)
    return HandoffState.model_validate(raw)
