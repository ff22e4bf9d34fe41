"""Slow and greedy peers: a trickling sender is cut off at its deadline with a reason, and one
process group holding connections cannot take the slots other processes need, whether they run as
its uid (engine pods commonly share one) or as another.

Real sockets and a real ``FramedServer``; each greedy peer is a separate process in a process group
of its own (as every engine container's first process is), holding its connections until the test
closes its stdin; one drops to another uid, the way a second local user would connect."""

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
    decode,
    encode,
    recv_frame,
)
from weightcache_contract.errors import CacheUnavailable, DaemonBusy

NOBODY = 65534


def pong(request: object, _fds: list[int]) -> Reply:
    assert isinstance(request, Ping)
    return Reply(Pong())


@pytest.fixture
def serve() -> Iterator:
    servers: list[tuple[FramedServer, threading.Thread]] = []
    with tempfile.TemporaryDirectory(prefix="wc-slow-") as d:
        os.chmod(d, 0o755)  # the other uid must reach the socket; the socket's own mode still decides

        def start(**kwargs: object) -> str:
            path = os.path.join(d, f"s{len(servers)}.sock")
            server = FramedServer(
                path,
                PeerPolicy(uids=frozenset({os.getuid(), 0, NOBODY})),
                REQUEST,
                pong,
                identity=("slow", 0),
                max_request_bytes=64 * 1024,
                **kwargs,
            )  # type: ignore[arg-type]
            thread = threading.Thread(target=server.serve_forever, daemon=True)
            thread.start()
            servers.append((server, thread))
            return path

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
import json, os, socket, sys
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
sys.stdin.read()  # hold every connection until the test closes stdin
"""


class Hog:
    """A process in a process group of its own that opens ``count`` connections, says hello on
    each, and holds them (the refused ones too) until ``release``."""

    def __init__(self, path: str, count: int, uid: int | None = None, prefix: tuple[str, ...] = ()) -> None:
        uid = os.getuid() if uid is None else uid
        hello = encode(Hello(versions=[1])).hex()
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-c", HOLDER, path, hello, str(count), str(uid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise AssertionError(f"the hog exited with {self.proc.wait()}")
        got = json.loads(line)
        self.uid, self.pgid = got["uid"], got["pgid"]
        self.answers = [decode(REPLY, bytes.fromhex(a)) for a in got["answers"]]

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
    path = serve(max_connections=6, max_connections_per_group=3, socket_mode=0o660, socket_gid=NOBODY)
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
    path = serve(max_connections=8, max_connections_per_group=3)
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
    path = serve(max_connections=4, max_connections_per_group=2)
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
    path = serve(max_connections=4, max_connections_per_group=2)
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
    path = serve(max_connections=2, max_connections_per_group=2)
    hogs(path, 2)
    errors = []
    for _ in range(25):
        with pytest.raises(DaemonBusy) as refused:
            DaemonConnection(path, timeout_s=0.1)
        errors.append(str(refused.value))
    assert all("is busy: all 2 connections are in use; retry shortly" in e for e in errors), errors


SERVER = r"""
import os, sys
from weightcache.daemon.server import FramedServer, PeerPolicy, Reply
from weightcache.wire.protocol import REQUEST, Pong
server = FramedServer(
    sys.argv[1], PeerPolicy(uids=frozenset({os.getuid()})), REQUEST, lambda request, fds: Reply(Pong()),
    identity=("slow", 0), max_request_bytes=65536, max_connections=4, max_connections_per_group=2,
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
            [*OWN_PID_NAMESPACE, sys.executable, "-c", SERVER, path],
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
