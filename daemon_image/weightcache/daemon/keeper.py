"""The keeper: a tiny per-node process that holds arena fds so a cache outlives its daemon.

It never initializes CUDA and never maps anything: it only holds file descriptors (a memfd for
``cpu-shm``, a cuMem POSIX fd for ``cuda-vmm``) and their manifests. While it holds an fd, the
memory behind it stays allocated, whatever happens to the daemon that made it. A daemon that
restarts with the same fingerprint withdraws the fd and is ready without touching disk; one
with a different fingerprint releases the old arena and loads. A daemon keeps a connection to
the keeper open; if the keeper restarts, the daemon sees the connection drop and deposits again.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from weightcache_contract.errors import CacheUnavailable, ProtocolError

from ..checkpoints.manifest import Manifest
from ..wire.fingerprint import Fingerprint
from ..wire.protocol import (
    KEEPER_REQUEST,
    MAX_REPLY_BYTES,
    Deposit,
    Holding,
    Holdings,
    KeeperAck,
    ListHoldings,
    Ping,
    Pong,
    Release,
    Withdraw,
    Withdrawn,
)
from .server import FramedServer, PeerPolicy, Reject, Reply

log = logging.getLogger("weightcache.keeper")
KEEPER_SOCKET = "keeper.sock"


def keeper_socket(socket_dir: str | os.PathLike[str]) -> Path:
    return Path(socket_dir) / KEEPER_SOCKET


@dataclass
class _Held:
    fd: int
    holding: Holding
    manifest: Manifest
    fingerprint: Fingerprint | None


class KeeperService:
    def __init__(self) -> None:
        self._held: dict[tuple[str, int], _Held] = {}
        self._lock = threading.Lock()

    def __call__(self, request: object, fds: list[int]) -> Reply:
        if isinstance(request, Ping):
            return Reply(Pong())
        if isinstance(request, Deposit):
            if len(fds) != 1:
                raise Reject("bad_message", f"deposit must carry exactly one fd, got {len(fds)}")
            fd = fds.pop()  # ours now
            holding = Holding(
                name=request.name,
                rank=request.rank,
                fingerprint_digest=request.fingerprint_digest,
                backend=request.backend,
                mapping_bytes=request.mapping_bytes,
                device_uuid=request.device_uuid,
                tensor_count=len(request.manifest),
                deposited_at=time.time(),
            )
            with self._lock:
                old = self._held.pop((request.name, request.rank), None)
                self._held[(request.name, request.rank)] = _Held(fd, holding, request.manifest, request.fingerprint)
            if old is not None:
                os.close(old.fd)
            log.info(
                "holding",
                extra={
                    "fields": {
                        "cache": request.name,
                        "rank": request.rank,
                        "fingerprint": request.fingerprint_digest[:16],
                        "bytes": request.mapping_bytes,
                    }
                },
            )
            return Reply(KeeperAck())
        if isinstance(request, Withdraw):
            with self._lock:
                held = self._held.get((request.name, request.rank))
                if held is None:
                    raise Reject("not_found", f"keeper holds nothing for cache {request.name!r} rank {request.rank}")
                if held.holding.fingerprint_digest != request.fingerprint_digest:
                    raise Reject(
                        "fingerprint_mismatch",
                        f"keeper holds fingerprint {held.holding.fingerprint_digest[:16]}… for "
                        f"{request.name!r} rank {request.rank}",
                    )
                fd = os.dup(held.fd)  # the keeper keeps holding its own until released
            return Reply(Withdrawn(holding=held.holding, manifest=held.manifest, fingerprint=held.fingerprint), [fd])
        if isinstance(request, Release):
            with self._lock:
                keys = [k for k in self._held if k[0] == request.name and request.rank in (None, k[1])]
                released = [self._held.pop(k) for k in keys]
            for held in released:
                os.close(held.fd)
                log.info("released", extra={"fields": {"cache": held.holding.name, "rank": held.holding.rank}})
            return Reply(KeeperAck(released=len(released)))
        if isinstance(request, ListHoldings):
            with self._lock:
                return Reply(Holdings(entries=[h.holding for h in self._held.values()]))
        raise Reject("bad_message", f"{getattr(request, 'type', request)!r} is not a keeper request")


def run(socket_dir: str, allow_uids: list[int] | None = None, allow_gids: list[int] | None = None) -> int:
    Path(socket_dir).mkdir(parents=True, exist_ok=True)
    path = keeper_socket(socket_dir)
    _refuse_live_keeper(path)
    path.unlink(missing_ok=True)
    policy = PeerPolicy(uids=frozenset({os.getuid(), 0, *(allow_uids or [])}), gids=frozenset(allow_gids or []))
    server = FramedServer(
        str(path),
        policy,
        KEEPER_REQUEST,
        KeeperService(),
        identity=("keeper", -1),
        max_request_bytes=MAX_REPLY_BYTES,
        accept_fds=True,
        idle_timeout_s=365 * 86400.0,
        frame_timeout_s=30.0,  # a deposit carries a manifest of up to 256 MiB
        # Never closes an idle connection to make room: a daemon's link waits on one, idle by design,
        # to see the keeper go away; closed, that daemon would deposit again and close another's.
        evict_idle_after_s=None,
    )
    signal.signal(signal.SIGTERM, lambda *_: server.stop())
    signal.signal(signal.SIGINT, lambda *_: server.stop())
    log.info("keeper listening", extra={"fields": {"socket": str(path)}})
    server.serve_forever()
    path.unlink(missing_ok=True)
    return 0


def _refuse_live_keeper(path: Path) -> None:
    from weightcache_contract.errors import DaemonAlreadyRunning

    try:
        with KeeperClient(path, timeout_s=1.0) as client:
            client.ping()
    except (CacheUnavailable, ProtocolError):
        return
    raise DaemonAlreadyRunning(f"a keeper already listens on {path}; stop it first")


class KeeperClient:
    """One connection to the keeper (daemons and tools)."""

    def __init__(self, path: str | os.PathLike[str], timeout_s: float = 5.0) -> None:
        from ..client.weights import DaemonConnection

        self._conn = DaemonConnection(path, timeout_s, client="keeper-client")

    def __enter__(self) -> KeeperClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    @property
    def sock(self) -> socket.socket:
        return self._conn._sock

    def ping(self) -> None:
        self._conn.ping()

    def deposit(self, deposit: Deposit, fd: int) -> None:
        self._conn.request(deposit, KeeperAck, send_fds=[fd])

    def withdraw(self, name: str, rank: int, digest: str) -> tuple[Withdrawn, int] | None:
        """The held arena and a new fd for it, or None if the keeper holds nothing for it."""
        fds: list[int] = []
        try:
            reply = self._conn.request(Withdraw(name=name, rank=rank, fingerprint_digest=digest), Withdrawn, fds)
        except ProtocolError as exc:
            if "[not_found]" in str(exc):
                return None
            raise
        if len(fds) != 1:
            for fd in fds:
                os.close(fd)
            raise ProtocolError(f"withdraw reply carried {len(fds)} fds, expected 1")
        return reply, fds[0]

    def release(self, name: str, rank: int | None = None) -> int:
        return self._conn.request(Release(name=name, rank=rank), KeeperAck).released

    def holdings(self) -> list[Holding]:
        return self._conn.request(ListHoldings(), Holdings).entries
