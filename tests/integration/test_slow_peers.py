"""Slow and greedy peers: a trickling sender is cut off at its deadline with a reason, and one uid
holding connections cannot take the slots other uids need.

Real sockets and a real ``FramedServer``; the greedy peer is a separate process that drops to
another uid, the way a second local user would connect."""

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
from collections.abc import Iterator

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
path, hello, count = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3])
os.setgroups([])
os.setgid(65534)
os.setuid(65534)
held, answers = [], []
for _ in range(count + 1):
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
print(json.dumps({"uid": os.getuid(), "answers": answers}), flush=True)
sys.stdin.read()  # hold every connection until the test closes stdin
"""


def test_one_uid_holding_its_share_of_connections_leaves_slots_for_other_uids(serve) -> None:
    try:
        pwd.getpwuid(NOBODY), grp.getgrgid(NOBODY)
    except KeyError:
        pytest.fail(f"uid/gid {NOBODY} must exist on the test machine")
    if os.getuid() != 0:
        pytest.fail("this test drops to another uid and must run as root")
    path = serve(max_connections=6, max_connections_per_uid=3, socket_mode=0o660, socket_gid=NOBODY)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, path, encode(Hello(versions=[1])).hex(), "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = holder.stdout.readline()  # type: ignore[union-attr]
        assert line, f"the holder exited with {holder.wait()}"
        got = json.loads(line)
        assert got["uid"] == NOBODY
        answers = [decode(REPLY, bytes.fromhex(a)) for a in got["answers"]]
        assert [a.type for a in answers[:3]] == ["hello_reply"] * 3
        refused = answers[3]
        assert isinstance(refused, ErrorReply) and refused.code == "busy"
        assert f"uid {NOBODY} already holds 3 connections" in refused.message
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
    finally:
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait(timeout=10)
