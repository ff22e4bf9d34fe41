"""Hostile and broken peers: the daemon answers or hangs up, and keeps serving everyone else correctly."""

import os
import socket
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, expect, load_from_disk, map_weights
from weightcache.wire.protocol import (
    MAX_REPLY_BYTES,
    REPLY,
    ErrorReply,
    Fetch,
    Hello,
    decode,
    encode,
    recv_frame,
    send_frame,
)
from weightcache.wire.rankfiles import RankFiles


@pytest.fixture
def served(llama, start_daemon):
    daemon = start_daemon(llama, dtype="bfloat16")
    return daemon, RankFiles(daemon.socket_dir, daemon.name, 0).socket


def raw(path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def reply_or_close(sock: socket.socket):
    """The daemon's answer: an ErrorReply, or None if it just hung up."""
    try:
        return decode(REPLY, recv_frame(sock, MAX_REPLY_BYTES))
    except Exception:
        return None
    finally:
        sock.close()


def assert_still_serving(daemon, llama) -> None:
    expected = expect(str(llama), Layout(), dtype="bfloat16")
    w = map_weights(expected, daemon.socket_dir, daemon.name)
    assert torch.equal(w.tensors["model.norm.weight"], load_from_disk(expected).tensors["model.norm.weight"])
    assert daemon.proc.poll() is None


def error_code(reply) -> str | None:
    return reply.code if isinstance(reply, ErrorReply) else None


def test_garbage_bytes(served, llama) -> None:
    daemon, path = served
    sock = raw(path)
    sock.sendall(os.urandom(3) + b"\x00" + os.urandom(60))
    assert error_code(reply_or_close(sock)) in ("bad_frame", "bad_message")
    assert_still_serving(daemon, llama)


def test_huge_length_prefix(served, llama) -> None:
    daemon, path = served
    sock = raw(path)
    sock.sendall(struct.pack(">I", 0xFFFFFFFF))
    reply = reply_or_close(sock)
    assert error_code(reply) == "bad_frame" and "exceeds" in reply.message
    assert_still_serving(daemon, llama)


def test_truncated_frame_then_disconnect(served, llama) -> None:
    daemon, path = served
    sock = raw(path)
    sock.sendall(encode(Hello(versions=[1]))[:7])
    sock.close()
    assert_still_serving(daemon, llama)


def test_wrong_protocol_version(served, llama) -> None:
    daemon, path = served
    sock = raw(path)
    send_frame(sock, Hello(versions=[7, 8]))
    reply = reply_or_close(sock)
    assert error_code(reply) == "version_mismatch" and "[7, 8]" in reply.message
    assert_still_serving(daemon, llama)


def test_unknown_message_type(served, llama) -> None:
    daemon, path = served
    sock = raw(path)
    send_frame(sock, Hello(versions=[1]))
    recv_frame(sock, MAX_REPLY_BYTES)
    body = msgpack.packb({"type": "exec", "cmd": "rm -rf /"})
    sock.sendall(struct.pack(">I", len(body)) + body)
    assert error_code(reply_or_close(sock)) == "bad_message"
    assert_still_serving(daemon, llama)


@pytest.mark.parametrize("first", ["fetch", "hello-twice"])
def test_out_of_order_messages(served, llama, first: str) -> None:
    daemon, path = served
    sock = raw(path)
    if first == "fetch":
        send_frame(sock, Fetch(fingerprint_digest="a" * 64))
    else:
        send_frame(sock, Hello(versions=[1]))
        recv_frame(sock, MAX_REPLY_BYTES)
        send_frame(sock, Hello(versions=[1]))
    assert error_code(reply_or_close(sock)) == "out_of_order"
    assert_still_serving(daemon, llama)


def test_client_vanishing_mid_transfer(served, llama) -> None:
    daemon, path = served
    digest = expect(str(llama), Layout(), dtype="bfloat16").fingerprint.digest
    for _ in range(20):
        sock = raw(path)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        send_frame(sock, Hello(versions=[1]))
        recv_frame(sock, MAX_REPLY_BYTES)
        send_frame(sock, Fetch(fingerprint_digest=digest))
        sock.recv(100)  # read a sliver of the manifest, then vanish
        sock.close()
    assert_still_serving(daemon, llama)


def test_an_idle_connection_does_not_block_others(served, llama) -> None:
    daemon, path = served
    idle = raw(path)
    try:
        assert_still_serving(daemon, llama)
    finally:
        idle.close()


def test_fifty_concurrent_clients_get_correct_data(served, llama) -> None:
    daemon, _ = served
    expected = expect(str(llama), Layout(), dtype="bfloat16")
    reference = load_from_disk(expected).tensors
    barrier = threading.Barrier(50)

    def one(_: int) -> bool:
        barrier.wait(timeout=30)
        w = map_weights(expected, daemon.socket_dir, daemon.name, timeout_s=60)
        return all(torch.equal(w.tensors[n], reference[n]) for n in reference)

    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(one, range(50)))
    assert results == [True] * 50
    with DaemonConnection(RankFiles(daemon.socket_dir, daemon.name, 0).socket) as conn:
        status = conn.status()
    assert status.fetches_total >= 50 and status.connections_active == 1


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root (CI runs as root)")
def test_peers_with_other_uids_are_refused(served, llama) -> None:
    daemon, path = served
    os.chmod(daemon.socket_dir, 0o755)
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o777)  # even with the file mode opened up, SO_PEERCRED still refuses
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become nobody and try
        os.close(read)
        code = b"?"
        try:
            os.setgid(65534)
            os.setuid(65534)
            sock = raw(path)
            # The daemon answers "forbidden" on accept, before reading anything, and hangs up.
            reply = reply_or_close(sock)
            code = (reply.code if isinstance(reply, ErrorReply) else "none").encode()
        except Exception as exc:  # noqa: BLE001 - report anything to the parent
            code = repr(exc).encode()
        os.write(write, code)
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    assert os.read(read, 200) == b"forbidden"
    assert_still_serving(daemon, llama)


def test_socket_is_private_by_default(served) -> None:
    _, path = served
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == oct(0o700)
