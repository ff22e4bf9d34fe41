"""The daemon's socket server: one thread per connection, strict protocol, bounded everything.

Each connection must start with ``hello``; anything malformed, oversized, unknown or out of
order gets an error reply and the connection is closed, while every other connection carries
on. Peers are checked with SO_PEERCRED before a byte is read. Connections are capped and idle
ones time out, so a misbehaving client can neither exhaust threads nor pin one forever.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from . import __version__
from .arena import Arena
from .errors import ProtocolError
from .fingerprint import Fingerprint
from .manifest import Manifest
from .protocol import (
    MAX_REQUEST_BYTES,
    REQUEST,
    SUPPORTED_VERSIONS,
    ConfigReply,
    ErrorReply,
    Fetch,
    FetchReply,
    Hello,
    HelloReply,
    PeerClosed,
    Ping,
    Pong,
    QueryConfig,
    Status,
    StatusReply,
    decode,
    encode,
    recv_frame,
    send_frame,
)

log = logging.getLogger("weightcache.server")
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class PeerPolicy:
    """Who may connect: the daemon's own uid and root, plus configured uids and gids."""

    uids: frozenset[int]
    gids: frozenset[int] = frozenset()

    def allows(self, uid: int, gid: int) -> bool:
        return uid in self.uids or gid in self.gids


@dataclass
class Served:
    """What the daemon serves and its counters (shared by connection threads)."""

    name: str
    rank: int
    arena: Arena
    manifest: Manifest
    fingerprint: Fingerprint
    load_seconds: float
    disk_bytes_read: int
    started: float = field(default_factory=time.monotonic)
    connections_total: int = 0
    connections_active: int = 0
    fetches_total: int = 0
    errors_total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                setattr(self, key, getattr(self, key) + delta)


class DaemonServer:
    def __init__(self, path: str, served: Served, policy: PeerPolicy, *, socket_mode: int = 0o600,
                 socket_gid: int | None = None, max_connections: int = 256, idle_timeout_s: float = 30.0) -> None:
        self.path = path
        self.served = served
        self.policy = policy
        self.max_connections = max_connections
        self.idle_timeout_s = idle_timeout_s
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._fetch_frame = encode(FetchReply(backend=served.arena.backend, manifest=served.manifest))
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            self._listener.bind(path)
        finally:
            os.umask(old_umask)
        if socket_gid is not None:
            os.chown(path, -1, socket_gid)
        os.chmod(path, socket_mode)
        self._listener.listen(128)

    def stop(self) -> None:
        """Safe from a signal handler: wakes the accept loop."""
        try:
            os.write(self._stop_w, b"x")
        except BlockingIOError:
            pass

    def serve_forever(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._stop_r, selectors.EVENT_READ)
            while True:
                events = sel.select()
                if any(key.fileobj == self._stop_r for key, _ in events):
                    break
                try:
                    conn, _ = self._listener.accept()
                except OSError:
                    continue
                self._admit(conn)
        self._listener.close()

    def _admit(self, conn: socket.socket) -> None:
        pid, uid, gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if not self.policy.allows(uid, gid):
            log.warning("peer refused", extra={"fields": {"pid": pid, "uid": uid, "gid": gid}})
            self._reply_and_close(conn, ErrorReply(code="forbidden", message=f"uid {uid}/gid {gid} may not use this cache"))
            return
        with self.served.lock:
            busy = self.served.connections_active >= self.max_connections
            if not busy:
                self.served.connections_active += 1
                self.served.connections_total += 1
        if busy:
            self._reply_and_close(conn, ErrorReply(code="busy", message="too many connections; retry shortly"))
            return
        threading.Thread(target=self._serve_connection, args=(conn, pid), daemon=True).start()

    def _reply_and_close(self, conn: socket.socket, reply: ErrorReply) -> None:
        self.served.count(errors_total=1)
        try:
            conn.settimeout(1.0)
            send_frame(conn, reply)
        except OSError:
            pass
        finally:
            conn.close()

    def _serve_connection(self, conn: socket.socket, pid: int) -> None:
        try:
            conn.settimeout(self.idle_timeout_s)
            greeted = False
            while True:
                try:
                    body = recv_frame(conn, MAX_REQUEST_BYTES)
                except PeerClosed:
                    return
                except ProtocolError as exc:
                    self._protocol_error(conn, pid, "bad_frame", exc)
                    return
                try:
                    request = decode(REQUEST, body)
                except ProtocolError as exc:
                    self._protocol_error(conn, pid, "bad_message", exc)
                    return
                if not greeted and not isinstance(request, Hello):
                    self._reply_and_close(conn, ErrorReply(code="out_of_order", message=f"{request.type} before hello"))
                    return
                if isinstance(request, Hello):
                    if greeted:
                        self._reply_and_close(conn, ErrorReply(code="out_of_order", message="hello sent twice"))
                        return
                    common = set(request.versions) & set(SUPPORTED_VERSIONS)
                    if not common:
                        self._reply_and_close(conn, ErrorReply(
                            code="version_mismatch",
                            message=f"daemon speaks protocol {list(SUPPORTED_VERSIONS)}, client offered {request.versions}"))
                        return
                    greeted = True
                    send_frame(conn, HelloReply(version=max(common), daemon_version=__version__,
                                                name=self.served.name, rank=self.served.rank))
                elif isinstance(request, Fetch):
                    if not self._fetch(conn, request):
                        return
                else:
                    send_frame(conn, self._answer(request))
        except (OSError, socket.timeout):
            return  # peer vanished or idled out; nothing to clean but the socket
        finally:
            self.served.count(connections_active=-1)
            conn.close()

    def _protocol_error(self, conn: socket.socket, pid: int, code: str, exc: ProtocolError) -> None:
        log.info("protocol error", extra={"fields": {"peer_pid": pid, "code": code, "error": str(exc)}})
        self._reply_and_close(conn, ErrorReply(code=code, message=str(exc)))  # type: ignore[arg-type]

    def _fetch(self, conn: socket.socket, request: Fetch) -> bool:
        ours = self.served.fingerprint.digest
        if request.fingerprint_digest != ours:
            self._reply_and_close(conn, ErrorReply(
                code="fingerprint_mismatch",
                message=f"daemon holds fingerprint {ours[:16]}…, engine expects {request.fingerprint_digest[:16]}…; "
                        "query_config shows what the daemon holds"))
            return False
        fd = self.served.arena.export_fd()
        try:
            send_frame(conn, self._fetch_frame, [fd])
        finally:
            os.close(fd)
        self.served.count(fetches_total=1)
        return True

    def _answer(self, request: QueryConfig | Status | Ping) -> ConfigReply | StatusReply | Pong:
        s = self.served
        if isinstance(request, Ping):
            return Pong()
        if isinstance(request, QueryConfig):
            return ConfigReply(fingerprint=s.fingerprint, fingerprint_digest=s.fingerprint.digest,
                               backend=s.arena.backend, arena_bytes=s.arena.size, tensor_count=len(s.manifest))
        with s.lock:
            return StatusReply(
                pid=os.getpid(), name=s.name, rank=s.rank, backend=s.arena.backend,
                fingerprint_digest=s.fingerprint.digest, arena_bytes=s.arena.size,
                tensor_count=len(s.manifest), load_seconds=s.load_seconds,
                disk_bytes_read=s.disk_bytes_read, uptime_seconds=time.monotonic() - s.started,
                connections_total=s.connections_total, connections_active=s.connections_active,
                fetches_total=s.fetches_total, errors_total=s.errors_total)
