"""A framed request/reply server on a Unix socket, shared by the daemon and the keeper.

One thread per connection, strict protocol, bounded everything. Peers are checked with
SO_PEERCRED before a byte is read. Each connection must start with ``hello``; anything
malformed, oversized, unknown or out of order gets an error reply and the connection is closed,
while every other connection carries on. Time is bounded per frame, not per ``recv``: a hello
must be complete within ``hello_timeout_s`` of connecting, every frame within ``frame_timeout_s``
of its first byte, and a connection idle for ``idle_timeout_s`` between frames is closed — so a
peer trickling bytes cannot pin a thread. Connections are capped in total and per peer group
(``max_connections_per_group``, below the total; ``peer_group``), so one process holding
connections cannot take the slots of another that shares its uid. Where a newcomer would hit a
cap, the connection idle longest (of its own group; for the total cap, of the group holding the
most) is closed to make room, if one has been idle ``evict_idle_after_s``; only where none has
is the newcomer refused. A refused or evicted peer gets a ``busy`` reply, written before its
connection is closed.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, TypeAdapter
from weightcache_contract.errors import ProtocolError

from .. import __version__
from ..wire.protocol import (
    SUPPORTED_VERSIONS,
    Deadlines,
    ErrorReply,
    Hello,
    HelloReply,
    PeerClosed,
    PeerTimeout,
    decode,
    encode,
    recv_frame,
    send_frame,
)

log = logging.getLogger("weightcache.server")
_UCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True)
class PeerPolicy:
    """Who may connect: the server's own uid and root, plus configured uids and gids."""

    uids: frozenset[int]
    gids: frozenset[int] = frozenset()

    def allows(self, uid: int, gid: int) -> bool:
        return uid in self.uids or gid in self.gids


class Reject(Exception):
    """Raised by a handler: send this error and close the connection."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Reply:
    """A handler's answer: a message (or pre-encoded frame) and fds to attach, closed after sending."""

    message: BaseModel | bytes
    fds: list[int] = field(default_factory=list)


Handler = Callable[[Any, list[int]], Reply]


@dataclass
class ServerStats:
    connections_total: int = 0
    connections_active: int = 0
    errors_total: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, **deltas: int) -> None:
        with self.lock:
            for key, delta in deltas.items():
                setattr(self, key, getattr(self, key) + delta)


Group = tuple[str, int]


@dataclass(eq=False)  # compared and hashed by identity: one slot is one connection, in its group's set
class _Slot:
    """One admitted connection as admission sees it.

    Every field is read and written under the server's lock (``stats.lock``) only. Why one lock for
    all: admission decides on the counts, the groups and the slots' states together, and the
    connection threads take it only twice per request (``_begin``/``_end``), briefly."""

    conn: socket.socket
    pid: int
    group: Group
    idle_since: float  # time.monotonic() when it connected or its last reply was sent
    busy: bool = False  # its thread is answering a request (or writing its last error): never evicted
    evicted: bool = False  # closed to make room: no longer counted, and its thread must not write again


class FramedServer:
    def __init__(
        self,
        path: str,
        policy: PeerPolicy,
        requests: TypeAdapter[Any],
        handler: Handler,
        *,
        identity: tuple[str, int],
        max_request_bytes: int,
        accept_fds: bool = False,
        socket_mode: int = 0o600,
        socket_gid: int | None = None,
        max_connections: int = 256,
        max_connections_per_group: int | None = None,
        idle_timeout_s: float = 30.0,
        frame_timeout_s: float = 5.0,
        hello_timeout_s: float = 5.0,
        evict_idle_after_s: float | None = 1.0,
        stats: ServerStats | None = None,
    ) -> None:
        self.path = path
        self.policy = policy
        self.requests = requests
        self.handler = handler
        self.identity = identity
        self.max_request_bytes = max_request_bytes
        self.accept_fds = accept_fds
        self.max_connections = max_connections
        # A quarter of the slots per peer group by default: one peer's leak leaves the rest usable.
        self.max_connections_per_group = max_connections_per_group or max(1, max_connections // 4)
        if self.max_connections_per_group > max_connections:
            raise ValueError(
                f"max_connections_per_group {self.max_connections_per_group} exceeds max_connections {max_connections}"
            )
        self.idle_timeout_s = idle_timeout_s
        self.frame_timeout_s = frame_timeout_s
        self.hello_timeout_s = hello_timeout_s
        # Why evict at all: peers in other pid namespaces (engine pods, daemon without hostPID) all
        # look like pid 0 and share one group per uid, so a per-group cap alone would let one pod
        # holding idle connections starve the pods that share its uid. Why a grace: a connection
        # just opened has not sent its first request yet, and one between two requests of a client
        # is not abandoned; a second is long for a client's turn-around and short for a waiting
        # newcomer. None: never evict (the keeper, whose clients hold idle connections by design).
        self.evict_idle_after_s = evict_idle_after_s
        # Per group, its admitted connections: the count is the set's size, and eviction picks from it.
        self._groups: dict[Group, set[_Slot]] = {}
        self.stats = stats or ServerStats()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
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
            self._reply_and_close(
                conn, ErrorReply(code="forbidden", message=f"uid {uid}/gid {gid} may not use this socket")
            )
            return
        group = peer_group(pid, uid)
        slot = _Slot(conn, pid, group, time.monotonic())
        busy = None
        with self.stats.lock:
            held = self._groups.get(group, set())
            # The group's cap first: making room in the group makes room in the total too.
            if len(held) >= self.max_connections_per_group:
                victim = self._idlest_locked(held, slot.idle_since)
                if victim is None and self.stats.connections_active >= self.max_connections:
                    busy = f"all {self.max_connections} connections are in use; retry shortly"  # the wider cap
                elif victim is None:
                    busy = (
                        f"{describe_group(group)} already holds {len(held)} connections, the most one may hold; "
                        "close idle ones or retry shortly"
                    )
                else:
                    self._evict_locked(
                        victim,
                        slot,
                        f"to make room for another client of the same {describe_group(group)}, "
                        f"which may hold {self.max_connections_per_group} connections",
                    )
            elif self.stats.connections_active >= self.max_connections:
                # Of the group holding the most (any of them, on a tie): the fair share to take from,
                # whoever the newcomer is; a busy biggest group is not spared at a smaller one's cost.
                most = max(len(slots) for slots in self._groups.values())
                biggest = [slots for slots in self._groups.values() if len(slots) == most]
                victim = self._idlest_locked((s for slots in biggest for s in slots), slot.idle_since)
                if victim is None:
                    busy = f"all {self.max_connections} connections are in use; retry shortly"
                else:
                    self._evict_locked(
                        victim,
                        slot,
                        f"to make room for another client: all {self.max_connections} connections were in use "
                        f"and {describe_group(victim.group)} held the most ({most})",
                    )
            if busy is None:
                self.stats.connections_active += 1
                self.stats.connections_total += 1
                self._groups.setdefault(group, set()).add(slot)
        if busy is not None:
            log.warning("connection refused", extra={"fields": {"pid": pid, "uid": uid, "reason": busy}})
            self._reply_and_close(conn, ErrorReply(code="busy", message=busy))
            return
        threading.Thread(target=self._serve_connection, args=(slot,), daemon=True).start()

    def _idlest_locked(self, slots: Iterable[_Slot], now: float) -> _Slot | None:
        """The connection idle longest among ``slots``, if one is idle and past the grace.

        A scan, O(len(slots)) ≤ O(connections), only when a cap is full. Why not a structure kept
        in idle order (an ordered dict per group, moved to the end on each reply): busy connections
        would still have to be skipped, every request would pay for it, and at 64 per group and 256
        in all a scan under the lock takes microseconds."""
        if self.evict_idle_after_s is None:
            return None
        idlest = None
        for candidate in slots:
            if candidate.busy or now - candidate.idle_since < self.evict_idle_after_s:
                continue
            if idlest is None or candidate.idle_since < idlest.idle_since:
                idlest = candidate
        return idlest

    def _evict_locked(self, victim: _Slot, newcomer: _Slot, why: str) -> None:
        """Close ``victim`` (idle, so its thread waits in ``recv_frame``) to make room for ``newcomer``.

        Under the lock, which is what makes it race-free: the victim is not busy, and its thread
        must take the lock (``_begin``) before it writes anything, so only this writes to it; its
        thread closes the socket only after taking the lock to unregister it, so the fd is open
        here. The slot stops counting at once; its thread sees the shutdown, ends and closes the fd."""
        idle = newcomer.idle_since - victim.idle_since
        victim.evicted = True
        self._unregister_locked(victim)
        message = f"idle connection closed after {idle:.1f} s {why}; reconnect when needed"
        log.info(
            "idle connection closed to make room",
            extra={"fields": {"pid": victim.pid, "group": describe_group(victim.group), "for_pid": newcomer.pid}},
        )
        frame = encode(ErrorReply(code="busy", message=message))
        # Through a duplicate without a timeout: Python waits for writability before sending on a
        # socket with one (the thread's), and this must not wait under the lock. MSG_DONTWAIT makes
        # the send one non-blocking syscall whatever the shared file's flags; a peer whose buffer is
        # full (it has not read what it was sent) does not get the text, or gets part of it.
        try:
            with socket.socket(fileno=os.dup(victim.conn.fileno())) as dup:
                dup.send(frame, socket.MSG_DONTWAIT)
        except OSError:
            pass
        try:
            victim.conn.shutdown(socket.SHUT_RDWR)  # wakes its thread's recv; the peer reads the text, then EOF
        except OSError:
            pass

    def _unregister_locked(self, slot: _Slot) -> None:
        held = self._groups[slot.group]
        held.discard(slot)
        if not held:
            del self._groups[slot.group]
        self.stats.connections_active -= 1

    def _begin(self, slot: _Slot) -> bool:
        """Before a thread writes to its connection: False if it was evicted (it must not write)."""
        with self.stats.lock:
            if slot.evicted:
                return False
            slot.busy = True
            return True

    def _end(self, slot: _Slot) -> None:
        """After a reply: the connection is idle again, from now."""
        with self.stats.lock:
            slot.busy = False
            slot.idle_since = time.monotonic()

    def _reply_and_close(self, conn: socket.socket, reply: ErrorReply) -> None:
        self.stats.count(errors_total=1)
        try:
            conn.settimeout(1.0)
            send_frame(conn, reply)
        except OSError:
            pass
        finally:
            conn.close()

    def _reject(self, conn: socket.socket, pid: int, code: str, message: str) -> None:
        log.info("request rejected", extra={"fields": {"peer_pid": pid, "code": code, "error": message}})
        self._reply_and_close(conn, ErrorReply(code=code, message=message))  # type: ignore[arg-type]

    def _serve_connection(self, slot: _Slot) -> None:
        conn, pid = slot.conn, slot.pid
        try:
            greeted = False
            unauthenticated = Deadlines(
                self.idle_timeout_s,
                self.frame_timeout_s,
                hello_by=time.monotonic() + self.hello_timeout_s,
                hello_s=self.hello_timeout_s,
            )
            greeted_deadlines = Deadlines(self.idle_timeout_s, self.frame_timeout_s)
            while True:
                fds: list[int] = []
                try:
                    body = recv_frame(
                        conn,
                        self.max_request_bytes,
                        fds if self.accept_fds else None,
                        greeted_deadlines if greeted else unauthenticated,
                    )
                except PeerClosed:
                    return
                except PeerTimeout as exc:
                    _close_all(fds)
                    if self._begin(slot):  # else evicted meanwhile: the peer has that reason already
                        self._reject(conn, pid, "timeout", str(exc))
                    return
                except ProtocolError as exc:
                    _close_all(fds)
                    if self._begin(slot):
                        self._reject(conn, pid, "bad_frame", str(exc))
                    return
                # From here to the reply's last byte the connection is busy, so never evicted. A
                # frame completed just as the connection was evicted is dropped unanswered: the
                # peer reads the eviction text instead, as if it had sent the request a moment later.
                if not self._begin(slot):
                    _close_all(fds)
                    return
                conn.settimeout(self.idle_timeout_s)  # for the reply: a peer must read it as it would a frame
                try:
                    request = decode(self.requests, body)
                except ProtocolError as exc:
                    _close_all(fds)
                    self._reject(conn, pid, "bad_message", str(exc))
                    return
                if isinstance(request, Hello):
                    _close_all(fds)
                    if greeted:
                        self._reject(conn, pid, "out_of_order", "hello sent twice")
                        return
                    common = set(request.versions) & set(SUPPORTED_VERSIONS)
                    if not common:
                        self._reject(
                            conn,
                            pid,
                            "version_mismatch",
                            f"server speaks protocol {list(SUPPORTED_VERSIONS)}, client offered {request.versions}",
                        )
                        return
                    greeted = True
                    send_frame(
                        conn,
                        HelloReply(
                            version=max(common),
                            daemon_version=__version__,
                            name=self.identity[0],
                            rank=self.identity[1],
                        ),
                    )
                    self._end(slot)
                    continue
                if not greeted:
                    _close_all(fds)
                    self._reject(conn, pid, "out_of_order", f"{request.type} before hello")
                    return
                try:
                    reply = self.handler(request, fds)  # takes ownership of the fds it keeps (pops them)
                except Reject as exc:
                    self._reject(conn, pid, exc.code, str(exc))
                    return
                finally:
                    _close_all(fds)
                try:
                    send_frame(conn, reply.message, reply.fds)
                finally:
                    _close_all(reply.fds)
                self._end(slot)
        except (TimeoutError, OSError):
            return  # peer vanished or idled out; nothing to clean but the socket
        finally:
            # Unregister before closing, under the lock: an evictor touches the socket only while
            # it is registered, so it never sees a closed (or reused) fd.
            with self.stats.lock:
                if not slot.evicted:  # an evicted slot was unregistered when it was evicted
                    self._unregister_locked(slot)
            conn.close()


def peer_group(pid: int, uid: int) -> tuple[str, int]:
    """The unit a connection counts against: the peer's process group, as ``("pgid", n)``.

    Why a process group and not the uid: engine pods commonly run as one uid, so a per-uid cap let
    one engine that leaks connections starve every other engine of the node. Why not the pod's
    cgroup (``/proc/<pid>/cgroup``): its layout differs between cgroup v1 and v2 and between
    container runtimes, and outside Kubernetes (a node's own services, tests) every process of a
    login or a service shares one; a process group is one syscall, the same everywhere, and still
    holds a whole engine (vLLM's workers inherit their parent's group, and every container's first
    process leads a session of its own). A process group is no security boundary (a process may
    start a new one with ``setsid``): the per-group cap contains a leak, the total cap bounds everything.

    ``pid`` is SO_PEERCRED's, the connecting process as this process's pid namespace numbers it:
    - 0 when the peer is outside that namespace (an engine pod while the daemon pod has no hostPID).
      Its group and its cgroup cannot be read (the kernel refuses its pidfd's info with EREMOTE),
      so nothing tells such peers apart but their uid: they count per uid, ``("uid", uid)``. What
      keeps one of them from starving the others is not this grouping but eviction (``_admit``):
      a newcomer takes the group's connection idle longest.
    - a process that has exited since it connected (its socket may live on in a child) has no
      group to look up; it counts alone, as ``("pid", pid)``. A pid reused meanwhile by another
      process lends the connection that process's group: one connection counted against the wrong
      group until it closes.
    """
    if pid == 0:
        return ("uid", uid)
    try:
        return ("pgid", os.getpgid(pid))
    except ProcessLookupError:
        return ("pid", pid)


def describe_group(group: tuple[str, int]) -> str:
    """A peer group in a busy reply, in words an operator can look up (``ps -o pgid``)."""
    kind, number = group
    if kind == "uid":
        return f"uid {number} (peers outside the daemon's pid namespace count per uid)"
    if kind == "pid":
        return f"process {number} (exited since it connected)"
    return f"process group {number}"


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
