"""Slow and greedy peers: a trickling sender is cut off at its deadline with a reason, and one
process group holding connections cannot take the slots other processes need, whether they run as
its uid (engine pods commonly share one) or as another. Where a cap is full, a newcomer takes the
connection that has been idle longest (of its own group, or of the group holding the most), so peers
the daemon cannot tell apart (other pid namespaces: one group per uid) cannot starve each other by
holding idle connections; a connection whose request is in progress is never taken.

Real sockets and a real ``FramedServer``; each greedy peer is a separate process in a process group
of its own (as every engine container's first process is), holding its connections until the test
closes its stdin, and on command sending a request on each or reporting what each has to read; one
drops to another uid, the way a second local user would connect."""

from __future__ import annotations

import grp
import json
import os
import pwd
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from weightcache.client.weights import DaemonConnection
from weightcache.daemon.server import FramedServer, PeerPolicy, Reply
from weightcache.wire.protocol import (
    MAX_REPLY_BYTES,
    REPLY,
    REQUEST,
    ErrorReply,
    Hello,
    Ping,
    Pong,
    Status,
    decode,
    encode,
    recv_frame,
)
from weightcache_contract.errors import CacheUnavailable, DaemonBusy

NOBODY = 65534
# The caps and their refusals, where every held connection is still within its grace (so none may be
# closed to make room): the tests of eviction below use the server's default grace.
LONG_GRACE_S = 60.0


def pong(request: object, _fds: list[int]) -> Reply:
    assert isinstance(request, (Ping, Status))
    return Reply(Pong())


@pytest.fixture
def serve() -> Iterator:
    servers: list[tuple[FramedServer, threading.Thread]] = []
    with tempfile.TemporaryDirectory(prefix="wc-slow-") as d:
        os.chmod(d, 0o755)  # the other uid must reach the socket; the socket's own mode still decides

        def start(handler: Callable[[object, list[int]], Reply] = pong, **kwargs: object) -> str:
            path = os.path.join(d, f"s{len(servers)}.sock")
            server = FramedServer(
                path,
                PeerPolicy(uids=frozenset({os.getuid(), 0, NOBODY})),
                REQUEST,
                handler,
                identity=("slow", 0),
                max_request_bytes=64 * 1024,
                **kwargs,
            )  # type: ignore[arg-type]
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            servers.append((server, thread))
            return path

        start.servers = servers  # type: ignore[attr-defined]
        yield start
        for server, thread in servers:
            server.stop()
            thread.join(timeout=10)


def trickle(path: str, data: bytes, interval_s: float) -> tuple[ErrorReply, float]:
    """Send ``data`` one byte per interval from a thread; return the server's answer and when it came."""

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(path)
    stop = threading.Event()

    def send() -> None:
        for byte in data:
            if stop.is_set():
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return
            stop.wait(interval_s)

    started = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        reply = decode(REPLY, recv_frame(sock, MAX_REPLY_BYTES))
        return reply, time.monotonic() - started
    finally:
        stop.set()
        sock.close()
        sender.join(timeout=5)


def test_a_peer_trickling_a_frame_is_cut_off_at_the_frame_deadline_with_a_reason(serve) -> None:
    path = serve(frame_timeout_s=1.0, idle_timeout_s=30.0)

    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(path)
    sock.sendall(encode(Hello(versions=[1])))
    recv_frame(sock, MAX_REPLY_BYTES)
    # Greeted; now a ping, one byte every 0.25 s: each recv sees a byte well within the idle limit.
    frame = encode(Ping())
    started = time.monotonic()
    stop = threading.Event()

    def send() -> None:
        for byte in frame:
            if stop.wait(0.25):
                return
            try:
                sock.send(bytes([byte]))
            except OSError:
                return

    threading.Thread(target=send, daemon=True).start()
    try:
        reply = decode(REPLY, recv_frame(sock, MAX_REPLY_BYTES))
    finally:
        stop.set()
    elapsed = time.monotonic() - started
    sock.close()
    assert isinstance(reply, ErrorReply) and reply.code == "timeout"
    assert "frame not complete within 1.0 s of its first byte" in reply.message
    assert "bytes arrived" in reply.message
    # The whole frame would take len(frame) × 0.25 s; the server hung up at its 1 s deadline instead.
    assert elapsed < len(frame) * 0.25
    with DaemonConnection(path) as conn:  # and it serves everyone else
        conn.ping()


def test_a_peer_that_never_completes_its_hello_is_cut_off_at_the_hello_deadline(serve) -> None:
    path = serve(hello_timeout_s=1.0, frame_timeout_s=30.0, idle_timeout_s=30.0)
    reply, elapsed = trickle(path, encode(Hello(versions=[1])), interval_s=0.2)
    assert isinstance(reply, ErrorReply) and reply.code == "timeout"
    assert reply.message.startswith("no hello within 1.0 s of connecting")
    assert elapsed < len(encode(Hello(versions=[1]))) * 0.2


def test_an_idle_connection_is_closed_with_a_reason(serve) -> None:
    path = serve(idle_timeout_s=0.5)
    with DaemonConnection(path) as conn:
        time.sleep(1.0)
        reply = decode(REPLY, recv_frame(conn._sock, MAX_REPLY_BYTES))
    assert isinstance(reply, ErrorReply) and reply.code == "timeout"
    assert "no request for 0.5 s" in reply.message


HOLDER = r"""
import json, os, select, socket, subprocess, sys
path, hello, count, uid = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
if uid != os.getuid():
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
held, answers = [], []
for _ in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(10)
    s.connect(path)
    try:
        s.sendall(hello)
    except OSError:
        pass  # a refused connection may be closed already; its answer is still there to read
    header = s.recv(4)
    body = b""
    while len(body) < int.from_bytes(header, "big"):
        body += s.recv(65536)
    answers.append(body.hex())
    held.append(s)
print(json.dumps({"uid": os.getuid(), "pgid": os.getpgid(0), "answers": answers}), flush=True)
for line in sys.stdin:  # commands, until the test closes stdin; every connection is held till then
    command, _, arg = line.strip().partition(" ")
    if command == "send":  # a frame on every connection, no reply read (a refused one fails: closed)
        for s in held:
            try:
                s.sendall(bytes.fromhex(arg))
            except OSError:
                pass
        print("{}", flush=True)
    elif command == "report":  # per connection: the frames it can read, waiting up to arg s for the first
        report = []
        for s in held:
            data, closed = b"", False
            while not closed:
                complete = len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big")
                if not select.select([s], [], [], 0 if complete else float(arg))[0]:
                    break
                try:
                    chunk = s.recv(1 << 20)
                except ConnectionResetError:
                    chunk = b""
                closed = not chunk
                data += chunk
            frames, sizes = [], []
            while len(data) >= 4 and len(data) >= 4 + int.from_bytes(data[:4], "big"):
                n = int.from_bytes(data[:4], "big")
                frames.append(data[4 : 4 + n].hex() if n <= 65536 else "")
                sizes.append(n)
                data = data[4 + n :]
            report.append({"frames": frames, "sizes": sizes, "rest": len(data), "closed": closed})
        print(json.dumps(report), flush=True)
    elif command == "run":  # a child process: a member of this process's group
        argv = json.loads(arg)
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True).stdout
        print(json.dumps(out), flush=True)
"""


@dataclass
class Held:
    """What one of a hog's connections had to read when asked, and whether the daemon had closed it."""

    frames: list[Any]  # decoded replies; None for a reply too big to bring back
    sizes: list[int]
    closed: bool


class Hog:
    """A process in a process group of its own that opens ``count`` connections, says hello on
    each, and holds them (the refused ones too) until ``release``; meanwhile it sends a frame on
    each (``send``), reports what each has to read (``report``), or runs a child (``run``)."""

    def __init__(self, path: str, count: int, uid: int | None = None, prefix: tuple[str, ...] = ()) -> None:
        uid = os.getuid() if uid is None else uid
        hello = encode(Hello(versions=[1])).hex()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", HOLDER, path, hello, str(count), str(uid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},  # for the children it runs
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"the hog exited with {self.proc.wait()}")
        got = json.loads(line)
        self.uid, self.pgid = got["uid"], got["pgid"]
        self.answers = [decode(REPLY, bytes.fromhex(a)) for a in got["answers"]]

    def _command(self, line: str) -> Any:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        answer = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not answer:
            raise AssertionError(f"the hog exited with {self.proc.wait()}")
        return json.loads(answer)

    def send(self, message: object) -> None:
        """Send ``message`` on each of its connections without reading a reply."""
        self._command(f"send {encode(message).hex()}")  # type: ignore[arg-type]

    def report(self, wait_s: float = 0.3) -> list[Held]:
        """What each connection has to read (and whether it is closed), waiting up to ``wait_s`` on
        each for a first whole frame, then taking only what is there already."""
        return [
            Held(
                [decode(REPLY, bytes.fromhex(f)) if f else None for f in got["frames"]],
                got["sizes"],
                got["closed"],
            )
            for got in self._command(f"report {wait_s}")
        ]

    def run(self, argv: list[str]) -> str:
        """Run a child (of its process group) to its end; its standard output."""
        return self._command(f"run {json.dumps(argv)}")

    def release(self) -> None:
        """Close every connection it holds (it exits)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=10)


@pytest.fixture
def hogs() -> Iterator[Callable[..., Hog]]:
    started: list[Hog] = []

    def start(path: str, count: int, uid: int | None = None, prefix: tuple[str, ...] = ()) -> Hog:
        started.append(Hog(path, count, uid, prefix))
        return started[-1]

    yield start
    for hog in started:
        hog.release()


def test_one_uid_holding_its_share_of_connections_leaves_slots_for_other_uids(serve, hogs) -> None:
    try:
        pwd.getpwuid(NOBODY), grp.getgrgid(NOBODY)
    except KeyError:
        pytest.fail(f"uid/gid {NOBODY} must exist on the test machine")
    if os.getuid() != 0:
        pytest.fail("this test drops to another uid and must run as root")
    path = serve(
        max_connections=6,
        max_connections_per_group=3,
        socket_mode=0o660,
        socket_gid=NOBODY,
        evict_idle_after_s=LONG_GRACE_S,
    )
    hog = hogs(path, 4, uid=NOBODY)
    assert hog.uid == NOBODY
    assert [a.type for a in hog.answers[:3]] == ["hello_reply"] * 3
    refused = hog.answers[3]
    assert isinstance(refused, ErrorReply) and refused.code == "busy"
    assert f"process group {hog.pgid} already holds 3 connections" in refused.message
    # While uid 65534 holds its three, root still gets the other three slots and is served.
    conns = [DaemonConnection(path) for _ in range(3)]
    try:
        for conn in conns:
            conn.ping()
        extra = socket.socket(socket.AF_UNIX)
        extra.settimeout(10)
        extra.connect(path)
        full = decode(REPLY, recv_frame(extra, MAX_REPLY_BYTES))
        extra.close()
        assert isinstance(full, ErrorReply) and full.code == "busy"
        assert full.message == "all 6 connections are in use; retry shortly"
    finally:
        for conn in conns:
            conn.close()


def test_a_process_holding_its_group_s_share_leaves_slots_for_other_processes_of_its_uid(serve, hogs) -> None:
    path = serve(max_connections=8, max_connections_per_group=3, evict_idle_after_s=LONG_GRACE_S)
    hog = hogs(path, 4)
    assert hog.uid == os.getuid() and hog.pgid != os.getpgid(0)
    assert [a.type for a in hog.answers] == ["hello_reply"] * 3 + ["error"]
    # The hog itself is refused past its group's share, with the reason and what to do.
    refused = hog.answers[3]
    assert isinstance(refused, ErrorReply) and refused.code == "busy"
    assert refused.message == (
        f"process group {hog.pgid} already holds 3 connections, the most one may hold; close idle ones or retry shortly"
    )
    # This process runs as the hog's uid, in another process group: it is served at once.
    started = time.monotonic()
    with DaemonConnection(path, timeout_s=5) as conn:
        conn.ping()
    assert time.monotonic() - started < 1.0


def test_a_client_finding_every_slot_taken_says_the_daemon_is_busy(serve, hogs) -> None:
    path = serve(max_connections=4, max_connections_per_group=2, evict_idle_after_s=LONG_GRACE_S)
    hogs(path, 2), hogs(path, 2)
    started = time.monotonic()
    with pytest.raises(CacheUnavailable) as refused:
        DaemonConnection(path, timeout_s=1.0)
    elapsed = time.monotonic() - started
    # The daemon's own words, after retrying for the whole timeout and no longer; never "Broken pipe".
    assert "all 4 connections are in use; retry shortly" in str(refused.value)
    assert "still busy after 1.0 s of retries" in str(refused.value)
    assert "Broken pipe" not in str(refused.value) and "reset" not in str(refused.value)
    assert 1.0 <= elapsed < 3.0


def test_a_client_finding_every_slot_taken_gets_one_once_a_slot_frees_within_its_timeout(serve, hogs) -> None:
    path = serve(max_connections=4, max_connections_per_group=2, evict_idle_after_s=LONG_GRACE_S)
    first, _ = hogs(path, 2), hogs(path, 2)
    release = threading.Timer(1.0, first.release)
    started = time.monotonic()
    release.start()
    try:
        with DaemonConnection(path, timeout_s=10) as conn:
            conn.ping()
    finally:
        release.join()
    # Refused while the hogs held every slot, retried, and served once the first hog let go.
    assert 1.0 <= time.monotonic() - started < 5.0


def test_a_refusal_reads_as_the_daemon_s_busy_text_however_the_client_s_hello_races_the_close(serve, hogs) -> None:
    # The daemon writes its refusal and closes at accept; a client's hello sent after that close
    # fails with a broken pipe (about one attempt in five on a 2-core machine), one sent before it
    # with a reset. Either way the refusal is in the client's receive buffer and is what it reports.
    # One attempt each (no retries, which would outlast the hogs' idle grace), with time enough for
    # the daemon's thread to answer on a loaded machine.
    path = serve(max_connections=2, max_connections_per_group=2, evict_idle_after_s=LONG_GRACE_S)
    hogs(path, 2)
    errors = []
    for _ in range(25):
        with pytest.raises(DaemonBusy) as refused:
            DaemonConnection(path, timeout_s=10, retry_busy=False)
        errors.append(str(refused.value))
    assert all("is busy: all 2 connections are in use; retry shortly" in e for e in errors), errors


SERVER = r"""
import os, sys
from weightcache.daemon.server import FramedServer, PeerPolicy, Reply
from weightcache.wire.protocol import REQUEST, Pong
grace = {"evict_idle_after_s": float(sys.argv[2])} if len(sys.argv) > 2 else {}
server = FramedServer(
    sys.argv[1], PeerPolicy(uids=frozenset({os.getuid()})), REQUEST, lambda request, fds: Reply(Pong()),
    identity=("slow", 0), max_request_bytes=65536, max_connections=4, max_connections_per_group=2, **grace,
)
print("listening", flush=True)
server.serve_forever()
"""
OWN_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--kill-child")


def test_peers_outside_the_daemon_s_pid_namespace_share_their_uid_s_slots_and_are_told_why(hogs) -> None:
    # A daemon pod without hostPID sees every engine pod's process as pid 0 (SO_PEERCRED) and
    # cannot look up its process group: such peers count per uid, and the refusal says so.
    if os.getuid() != 0:
        pytest.fail("this test starts processes in pid namespaces of their own and must run as root")
    with tempfile.TemporaryDirectory(prefix="wc-ns-") as d:
        path = os.path.join(d, "s.sock")
        daemon = subprocess.Popen(
            [*OWN_PID_NAMESPACE, sys.executable, "-c", SERVER, path, str(LONG_GRACE_S)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:
            assert daemon.stdout.readline() == "listening\n", f"the server exited with {daemon.wait()}"  # type: ignore[union-attr]
            first = hogs(path, 2, prefix=OWN_PID_NAMESPACE)
            second = hogs(path, 1, prefix=OWN_PID_NAMESPACE)
            assert [a.type for a in first.answers] == ["hello_reply"] * 2
            refused = second.answers[0]
            assert isinstance(refused, ErrorReply) and refused.code == "busy"
            assert refused.message.startswith(
                f"uid {os.getuid()} (peers outside the daemon's pid namespace count per uid) already holds 2 connections"
            )
            first.release()
            with DaemonConnection(path, timeout_s=5) as conn:  # this process is outside it too
                conn.ping()
        finally:
            daemon.kill()  # unshare ignores SIGTERM while it waits; --kill-child takes the server with it
            daemon.wait(timeout=10)


# Fair slots: a newcomer takes the idlest connection of whoever fills the cap (the server's default
# grace: a connection must have been idle at least a second).
GRACE_S = 1.0
NEWCOMER = r"""
import json, os, sys
from weightcache.client.weights import DaemonConnection
try:
    with DaemonConnection(sys.argv[1], timeout_s=float(sys.argv[2])) as conn:
        conn.ping()
    print(json.dumps({"pgid": os.getpgid(0), "served": True}))
except Exception as exc:
    print(json.dumps({"pgid": os.getpgid(0), "served": False, "error": f"{type(exc).__name__}: {exc}"}))
"""


def newcomer(path: str, timeout_s: float = 1.0) -> list[str]:
    """A client process that connects (retrying a busy daemon for ``timeout_s``) and pings."""
    return [sys.executable, "-c", NEWCOMER, path, str(timeout_s)]


def evicted(held: list[Held]) -> list[ErrorReply]:
    """The eviction notices among a hog's connections: each closed, with one busy frame to read."""
    closed = [h for h in held if h.closed]
    assert all(len(h.frames) == 1 and isinstance(h.frames[0], ErrorReply) for h in closed), closed
    return [h.frames[0] for h in closed]


def test_a_newcomer_of_a_group_holding_all_its_connections_idle_takes_the_idlest_of_them(serve, hogs) -> None:
    path = serve(max_connections=8, max_connections_per_group=3)
    hog = hogs(path, 3)
    assert [a.type for a in hog.answers] == ["hello_reply"] * 3
    time.sleep(GRACE_S + 0.3)
    # A child of the hog: the same process group, whose three connections all sit idle.
    got = json.loads(hog.run(newcomer(path)))
    assert got == {"pgid": hog.pgid, "served": True}
    held = hog.report()
    [notice] = evicted(held)
    assert notice.code == "busy"
    assert notice.message.startswith("idle connection closed after ")
    assert notice.message.endswith(
        f"to make room for another client of the same process group {hog.pgid}, which may hold 3 connections; "
        "reconnect when needed"
    )
    # The other two are untouched: open, nothing to read, and they still answer.
    assert [(h.closed, h.frames) for h in held].count((False, [])) == 2
    hog.send(Ping())
    assert sorted((h.closed, [f.type for f in h.frames]) for h in hog.report(wait_s=5.0)) == [
        (False, ["pong"]),
        (False, ["pong"]),
        (True, []),
    ]


def test_a_newcomer_finding_every_slot_taken_takes_an_idle_one_of_the_group_holding_the_most(serve, hogs) -> None:
    path = serve(max_connections=4, max_connections_per_group=3)
    small = hogs(path, 1)  # idle the longest, but its group holds one connection
    big = hogs(path, 3)
    time.sleep(GRACE_S + 0.3)
    started = time.monotonic()
    with DaemonConnection(path, timeout_s=1.0) as conn:  # a third process group: its own cap is not full
        conn.ping()
    assert time.monotonic() - started < 0.5  # at its first attempt, not by retrying
    assert [(h.closed, h.frames) for h in small.report()] == [(False, [])]
    [notice] = evicted(big.report())
    assert notice.code == "busy"
    assert notice.message.startswith("idle connection closed after ")
    assert notice.message.endswith(
        f"to make room for another client: all 4 connections were in use and process group {big.pgid} held the "
        "most (3); reconnect when needed"
    )


BIG_REPLY = 8 << 20  # far more than a Unix socket buffers: the daemon's send blocks until the peer reads


class Gate:
    """A handler that holds each ``status`` request in progress: answering it (until ``open``), or
    sending a reply too big to buffer to a peer that does not read it."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.entered = threading.Semaphore(0)
        self.opened = threading.Event()

    def __call__(self, request: object, _fds: list[int]) -> Reply:
        if isinstance(request, Ping):
            return Reply(Pong())
        assert isinstance(request, Status)
        self.entered.release()
        if self.mode == "reading slowly":
            return Reply(BIG_REPLY.to_bytes(4, "big") + bytes(BIG_REPLY))
        self.opened.wait(30)
        return Reply(Pong())

    def wait_entered(self, count: int) -> None:
        for _ in range(count):
            assert self.entered.acquire(timeout=10), "a request never reached the handler"


@pytest.mark.parametrize("mode", ["answering", "reading slowly"])
def test_a_connection_whose_request_is_in_progress_is_never_taken(serve, hogs, mode: str) -> None:
    gate = Gate(mode)
    path = serve(handler=gate, max_connections=4, max_connections_per_group=2)
    first, second = hogs(path, 2), hogs(path, 2)
    first.send(Status()), second.send(Status())
    gate.wait_entered(4)
    time.sleep(GRACE_S + 0.3)  # every connection is long past the grace, but none is idle
    with pytest.raises(DaemonBusy) as refused:
        DaemonConnection(path, timeout_s=0.5)
    assert "is busy: all 4 connections are in use; retry shortly" in str(refused.value)
    # Each request is answered in full, on a connection left open.
    gate.opened.set()
    size = len(encode(Pong())) - 4 if mode == "answering" else BIG_REPLY
    expected = [[size], [size]]
    for hog in (first, second):
        held = hog.report(wait_s=2.0)
        assert [h.sizes for h in held] == expected
        assert not any(h.closed for h in held)
        if mode == "answering":
            assert [[f.type for f in h.frames] for h in held] == [["pong"], ["pong"]]


def test_peers_outside_the_daemon_s_pid_namespace_take_idle_connections_of_their_uid(hogs) -> None:
    # The hog and the newcomer each in a pid namespace of its own, with this process's uid: the
    # daemon sees pid 0 for both, so they are one group (their uid); the newcomer is served anyway.
    if os.getuid() != 0:
        pytest.fail("this test starts processes in pid namespaces of their own and must run as root")
    with tempfile.TemporaryDirectory(prefix="wc-ns-") as d:
        path = os.path.join(d, "s.sock")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        daemon = subprocess.Popen(
            [*OWN_PID_NAMESPACE, sys.executable, "-c", SERVER, path], stdout=subprocess.PIPE, text=True, env=env
        )
        try:
            assert daemon.stdout.readline() == "listening\n", f"the server exited with {daemon.wait()}"  # type: ignore[union-attr]
            hog = hogs(path, 2, prefix=OWN_PID_NAMESPACE)
            assert [a.type for a in hog.answers] == ["hello_reply"] * 2
            time.sleep(GRACE_S + 0.3)
            out = subprocess.run(
                [*OWN_PID_NAMESPACE, *newcomer(path)], stdout=subprocess.PIPE, text=True, env=env, timeout=30
            ).stdout
            got = json.loads(out)
            assert got["served"], got
            [notice] = evicted(hog.report())
            assert notice.code == "busy"
            assert notice.message.endswith(
                f"to make room for another client of the same uid {os.getuid()} (peers outside the daemon's pid "
                "namespace count per uid), which may hold 2 connections; reconnect when needed"
            )
        finally:
            daemon.kill()
            daemon.wait(timeout=10)


def test_under_churn_every_answer_is_a_reply_or_the_eviction_text_and_no_slot_leaks(serve) -> None:
    # Zero grace: every idle connection may be taken at any moment, racing its own next request.
    path = serve(max_connections=6, max_connections_per_group=3, evict_idle_after_s=0.0)
    outcomes: dict[str, int] = {}
    lock = threading.Lock()

    def client() -> None:
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            try:
                with DaemonConnection(path, timeout_s=5.0) as conn:
                    for _ in range(3):
                        conn.ping()
                outcome = "served"
            except DaemonBusy as exc:
                outcome = "evicted" if "to make room for another client" in str(exc) else str(exc)
            except Exception as exc:  # anything else is a bug: a torn frame, a reset without a reason
                outcome = f"{type(exc).__name__}: {exc}"
            with lock:
                outcomes[outcome] = outcomes.get(outcome, 0) + 1

    threads = [threading.Thread(target=client) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert set(outcomes) <= {"served", "evicted"}, outcomes
    assert outcomes.get("served", 0) > 0 and outcomes.get("evicted", 0) > 0, outcomes
    [(server, _)] = serve.servers
    deadline = time.monotonic() + 5
    while server.stats.connections_active and time.monotonic() < deadline:
        time.sleep(0.05)  # the last connections' threads see their peers close
    assert server.stats.connections_active == 0
    assert server._groups == {}
