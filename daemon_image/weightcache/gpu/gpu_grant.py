"""The GPU grant: which GPUs of a node the scheduler gave a cache's GPU holder pod, as a file.

Why a separate holder: a pod that requests ``nvidia.com/gpu`` owns those GPUs in the scheduler's
books, and the scheduler never gives them to a second pod. If daemon pods requested their GPUs,
two generations' daemons could never run on one node's GPUs, and a daemon generation change
could only go node by node. So one long-lived pod per node (``weightcache gpu-holder``) requests
the GPUs and writes which ones it got here; daemon pods of every generation request none, see
every device (``NVIDIA_VISIBLE_DEVICES=all``) and put local rank ``i`` on the ``i``-th GPU of the
grant, found by UUID. The holder keeps the GPUs booked; the daemons (and their keepers) keep the
memory on them.

Two files side by side, in a host directory shared by the holder (read-write) and the daemons
(read-only):

- ``gpus.json``: the grant (UUIDs in NVML index order, the holder pod's name, uid and node, and a
  random token of the holder's life), written atomically (write, fsync, rename). A rename, so a
  reader never sees half a file, and so daemons must mount the *directory*: a bind mount of the
  file itself would keep showing the inode it was mounted with.
- ``gpus.lock``: an ``flock`` the holder takes before writing and keeps for its whole life, with
  its token as content. The kernel drops the lock however the holder dies, so "are these GPUs
  booked right now?" never depends on a pid from another pid namespace; and a grant whose token is
  not the lock's is a previous holder's, not yet replaced.

The grant is left in place when the holder stops: a restarted holder replaces it within
milliseconds of starting, and removing it would make every daemon's readiness flap through an
ordinary holder restart. What a reader must check is therefore the lock and the token, not the
file's existence (``grant_problem``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from weightcache_contract.errors import WeightCacheError

from .. import status_note

log = logging.getLogger("weightcache.gpu_grant")
GRANT_VERSION = 1
WAIT_POLL_S = 0.5
WAIT_REMIND_S = 30.0


@dataclass(frozen=True)
class Grant:
    uuids: tuple[str, ...]
    """``GPU-…`` UUIDs of the GPUs the holder pod was given, in NVML index order."""
    token: str
    """Random per holder life; equals the lock file's content while that holder lives."""
    pod: str = ""
    pod_uid: str = ""
    node: str = ""
    pid: int = 0
    written_at: float = 0.0
    version: int = GRANT_VERSION

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "uuids": list(self.uuids)}, indent=1)

    @classmethod
    def parse(cls, text: str) -> Grant:
        """The grant in ``text``; ``ValueError`` when it is not one this version understands."""
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("version") != GRANT_VERSION:
            raise ValueError(f"not a version {GRANT_VERSION} GPU grant")
        uuids = raw.get("uuids")
        if not isinstance(uuids, list) or not all(isinstance(u, str) and u.startswith("GPU-") for u in uuids):
            raise ValueError("uuids must be a list of GPU-… strings")
        if not isinstance(raw.get("token"), str) or not raw["token"]:
            raise ValueError("token missing")
        return cls(
            uuids=tuple(uuids),
            token=raw["token"],
            pod=str(raw.get("pod", "")),
            pod_uid=str(raw.get("pod_uid", "")),
            node=str(raw.get("node", "")),
            pid=int(raw.get("pid", 0)),
            written_at=float(raw.get("written_at", 0.0)),
        )


def lock_path(grant_file: Path) -> Path:
    """``gpus.json`` → ``gpus.lock`` beside it."""
    return grant_file.with_suffix(".lock")


def write_grant(grant_file: Path, grant: Grant) -> None:
    """Atomically replaces the grant: readers see the old file or the new one, never a mix."""
    tmp = grant_file.with_name(f".{grant_file.name}.tmp{os.getpid()}")
    with open(tmp, "w") as out:
        out.write(grant.to_json())
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, 0o644)
    os.replace(tmp, grant_file)
    dir_fd = os.open(grant_file.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_grant(grant_file: Path) -> Grant | None:
    """The grant, or None when there is none (yet) or it cannot be read."""
    try:
        return Grant.parse(grant_file.read_text())
    except (OSError, ValueError, TypeError):
        return None


def live_token(grant_file: Path) -> str | None:
    """The token of the holder that holds the lock now, or None when no holder runs."""
    path = lock_path(grant_file)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            return os.pread(fd, 256, 0).decode(errors="replace").strip() or None
        return None  # we got the lock: nobody holds it
    finally:
        os.close(fd)


def take_lock(grant_file: Path, token: str) -> int:
    """The holder's side: takes ``gpus.lock`` (waiting, with a log line, while a previous holder
    still runs) and writes ``token`` into it; returns the fd, which must stay open."""
    path = lock_path(grant_file)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            os.close(fd)
            raise
        log.info("waiting for the previous GPU holder to exit", extra={"fields": {"lock": str(path)}})
        fcntl.flock(fd, fcntl.LOCK_EX)
    os.ftruncate(fd, 0)
    os.pwrite(fd, token.encode(), 0)
    os.fchmod(fd, 0o644)
    return fd


def current_grant(grant_file: Path) -> tuple[Grant | None, str | None]:
    """(the grant of the holder running now, None) or (None, why there is none)."""
    token = live_token(grant_file)
    if token is None:
        return None, f"no GPU holder runs (nobody holds {lock_path(grant_file)})"
    grant = read_grant(grant_file)
    if grant is None:
        return None, f"the GPU holder runs but {grant_file} is missing or unreadable"
    if grant.token != token:
        return (
            None,
            f"{grant_file} is a previous GPU holder's (pod {grant.pod or '?'}); the running holder has not replaced it yet",
        )
    return grant, None


def wait_for_grant(grant_file: Path, index: int, poll_s: float = WAIT_POLL_S, remind_s: float = WAIT_REMIND_S) -> str:
    """Blocks until the running holder's grant is there; returns its ``index``-th GPU UUID. A
    daemon waits rather than guesses: any GPU it picked itself may be another pod's."""
    last_log = float("-inf")
    noted = None
    while True:
        grant, why = current_grant(grant_file)
        if grant is not None:
            if index < len(grant.uuids):
                status_note.note(f"starting on {grant.uuids[index]}, granted by the GPU holder")
                return grant.uuids[index]
            raise WeightCacheError(
                f"{grant_file} grants {len(grant.uuids)} GPUs (holder pod {grant.pod or '?'}) but this is local rank "
                f"{index}: the GPU holder must request at least one GPU per local rank"
            )
        if why != noted:
            status_note.note(f"waiting for the GPU holder's grant before touching any GPU: {why}")
            noted = why
        if time.monotonic() - last_log >= remind_s:
            log.info(
                "waiting for the GPU holder's grant before touching any GPU",
                extra={"fields": {"file": str(grant_file), "reason": why}},
            )
            last_log = time.monotonic()
        time.sleep(poll_s)


def grant_problem(grant_file: Path, uuid: str) -> str | None:
    """Why the GPU ``uuid`` (a rank's arena) is not booked by the running holder, or None when it
    is. Not booked means the scheduler may give that GPU to another pod while our weights use it."""
    grant, why = current_grant(grant_file)
    if grant is None:
        return f"{why}: {uuid} is not booked in the scheduler's books"
    if uuid not in grant.uuids:
        return (
            f"{uuid} is no longer granted to the GPU holder (pod {grant.pod or '?'} holds "
            f"{', '.join(grant.uuids) or 'no GPU'}): delete this daemon pod so it loads onto the granted GPUs"
        )
    return None
