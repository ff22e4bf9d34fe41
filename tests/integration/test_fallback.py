"""Mismatch policy: disk fallback says why, error policy raises, mismatched weights are never mapped."""

import socket

import pytest
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, load_weights
from weightcache.wire.protocol import MAX_REPLY_BYTES, REPLY, ErrorReply, Fetch, Hello, decode, recv_frame, send_frame
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.errors import CacheUnavailable, FingerprintMismatch, UnsupportedQuantization


def test_missing_daemon_falls_back_to_disk_and_says_why(llama, socket_dir) -> None:
    w = load_weights(str(llama), Layout(), socket_dir=socket_dir, name="nobody", fallback="disk", dtype="bfloat16")
    assert w.mode == "disk" and w.bytes_mapped == 0 and w.bytes_loaded > 0
    assert "CacheUnavailable: no daemon listens on" in w.fallback_reason
    assert w.report()["fallback_reason"] == w.fallback_reason


def test_missing_daemon_with_error_policy_raises(llama, socket_dir) -> None:
    with pytest.raises(CacheUnavailable, match="no daemon listens on .*nobody/rank-0.sock"):
        load_weights(str(llama), Layout(), socket_dir=socket_dir, name="nobody", fallback="error", dtype="bfloat16")


def test_fingerprint_mismatch_falls_back_and_names_the_field(llama, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16", revision="v1")
    w = load_weights(
        str(llama),
        Layout(),
        socket_dir=daemon.socket_dir,
        name=daemon.name,
        fallback="disk",
        dtype="float32",
        revision="v1",
    )
    assert w.mode == "disk" and w.arena is None and w.bytes_mapped == 0
    assert "differs in: dtype" in w.fallback_reason
    with pytest.raises(FingerprintMismatch) as info:
        load_weights(
            str(llama),
            Layout(),
            socket_dir=daemon.socket_dir,
            name=daemon.name,
            fallback="error",
            dtype="bfloat16",
            revision="v2",
        )
    assert info.value.fields == ["revision"]
    # The matching expectation still maps.
    ok = load_weights(
        str(llama),
        Layout(),
        socket_dir=daemon.socket_dir,
        name=daemon.name,
        fallback="error",
        dtype="bfloat16",
        revision="v1",
    )
    assert ok.mode == "cache"


def test_daemon_never_sends_the_fd_for_a_wrong_fingerprint(llama, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16")
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(RankFiles(daemon.socket_dir, daemon.name, 0).socket))
    send_frame(sock, Hello(versions=[1]))
    recv_frame(sock, MAX_REPLY_BYTES)
    send_frame(sock, Fetch(fingerprint_digest="0" * 64))
    fds: list[int] = []
    reply = decode(REPLY, recv_frame(sock, MAX_REPLY_BYTES, fds))
    assert isinstance(reply, ErrorReply) and reply.code == "fingerprint_mismatch" and fds == []
    sock.close()


def test_unsupported_quantization_is_refused_before_any_socket_io(llama, start_daemon) -> None:
    daemon = start_daemon(llama, dtype="bfloat16")
    before = DaemonConnection(RankFiles(daemon.socket_dir, daemon.name, 0).socket).status().connections_total
    with pytest.raises(UnsupportedQuantization, match="'awq' is not supported"):
        load_weights(
            str(llama), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="disk", quantization="awq"
        )
    after = DaemonConnection(RankFiles(daemon.socket_dir, daemon.name, 0).socket).status().connections_total
    assert after == before + 1  # only the status connection itself
