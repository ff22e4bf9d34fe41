"""The files that represent one rank of one cache on a node: socket, ready file, lock.

``<socket-dir>/<name>/rank-<r>.{sock,ready,lock}``. The lock is an ``flock`` held for the
daemon's whole life: the kernel drops it when the process dies, however it dies, so "is a live
daemon here?" never depends on a pid that may have been reused. The ready file is written
atomically (write + rename) only once the socket listens, and removed on clean shutdown.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
from pathlib import Path

from pydantic import BaseModel
from weightcache_contract.errors import DaemonAlreadyRunning, WeightCacheError

from .fingerprint import Fingerprint

_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")
# sockaddr_un.sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH = 107


class ReadyInfo(BaseModel):
    pid: int
    name: str
    rank: int
    backend: str
    socket: str
    fingerprint_digest: str
    fingerprint: Fingerprint
    arena_bytes: int
    tensor_count: int
    load_seconds: float
    started_at: float
    device_uuid: str | None = None
    adopted: bool = False


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise WeightCacheError(
            f"cache name {name!r} is invalid: use lowercase letters, digits, '-' and '.', "
            "starting and ending with a letter or digit, at most 63 characters"
        )
    return name


class RankFiles:
    def __init__(self, socket_dir: str | os.PathLike[str], name: str, rank: int) -> None:
        self.dir = Path(socket_dir) / check_name(name)
        self.name = name
        self.rank = rank
        self.socket = self.dir / f"rank-{rank}.sock"
        self.ready = self.dir / f"rank-{rank}.ready"
        self.lock = self.dir / f"rank-{rank}.lock"
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise WeightCacheError(
                f"socket path {self.socket} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket allows; "
                "use a shorter --socket-dir"
            )
        self._lock_fd: int | None = None

    def claim(self, dir_mode: int = 0o700) -> None:
        """Take the rank's lock, refusing if a live daemon holds it, and clear a dead one's files."""
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, dir_mode)
        fd = os.open(self.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                holder = self.read_ready()
                pid = f" (pid {holder.pid})" if holder else ""
                raise DaemonAlreadyRunning(
                    f"a live daemon{pid} already serves cache {self.name!r} rank {self.rank} in {self.dir}; "
                    "stop it first (SIGTERM) or use another --name or --socket-dir"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd
        for stale in (self.ready, self.socket):
            stale.unlink(missing_ok=True)

    def write_ready(self, info: ReadyInfo) -> None:
        tmp = self.ready.with_suffix(f".ready.tmp{os.getpid()}")
        tmp.write_text(info.model_dump_json())
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.ready)

    def read_ready(self) -> ReadyInfo | None:
        try:
            return ReadyInfo.model_validate(json.loads(self.ready.read_text()))
        except (OSError, ValueError):
            return None

    @property
    def lock_fd(self) -> int | None:
        """The flock'ed descriptor while this process holds the rank (to pass on across ``exec``)."""
        return self._lock_fd

    def adopt_lock(self, fd: int) -> None:
        """Hold the rank's lock through ``fd``, an flock'ed descriptor of it inherited across ``exec``."""
        os.set_inheritable(fd, False)
        self._lock_fd = fd

    def release(self) -> None:
        """Clean shutdown: remove the ready file first so nobody connects to a closing socket."""
        self.ready.unlink(missing_ok=True)
        self.socket.unlink(missing_ok=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def lock_is_held(self) -> bool:
        """True while some live process holds this rank's lock (probe side)."""
        try:
            fd = os.open(self.lock, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False


def default_socket_dir() -> str:
    """``$WEIGHTCACHE_SOCKET_DIR``, else ``$XDG_RUNTIME_DIR/weightcache``, else ``/tmp/weightcache``."""
    return os.environ.get("WEIGHTCACHE_SOCKET_DIR") or str(
        Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp")) / "weightcache"
    )
