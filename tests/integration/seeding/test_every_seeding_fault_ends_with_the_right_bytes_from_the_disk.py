"""Each way a seed can go wrong ends the same: the starting daemon loads from the disk, serves
the right bytes, and its status says which peer failed and why. Never a served wrong byte."""

from __future__ import annotations

import signal

import pytest
import torch
from seeding_builders import free_port, peers_file, served_copy, status, weights_digests
from testcluster.waiting import wait_for
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import expect, load_from_disk, load_weights
from weightcache.seeding.arena_bytes import ArenaBytes
from weightcache.seeding.messages import CHUNK_BYTES
from weightcache.seeding.server import SeedServer


def start_peer(start_daemon, llama, tmp_path, key: str, port: int, **launch):
    return start_daemon(
        llama,
        name="faults",
        keeper="off",
        socket_dir_override=str(tmp_path / "node-a"),
        seed_listen=f"127.0.0.1:{port}",
        seed_credential_file=key,
        **{"dtype": "bfloat16", **launch},
    )


def start_fresh(start_daemon, llama, tmp_path, key: str, peers: str, **launch):
    return start_daemon(
        llama,
        name="faults",
        dtype="bfloat16",
        keeper="off",
        socket_dir_override=str(tmp_path / "node-b"),
        seed_peers_file=peers,
        seed_credential_file=key,
        node_name="node-b",
        **launch,
    )


def assert_served_from_disk(fresh, llama, *reasons: str) -> None:
    st = status(fresh)
    assert st.seed is not None and st.seed.peer is None, st.seed
    assert any(reason in (st.seed.fallback or "") for reason in reasons), st.seed.fallback
    assert st.disk_bytes_read > 0
    mapped = load_weights(
        str(llama), Layout(), socket_dir=fresh.socket_dir, name="faults", fallback="error", dtype="bfloat16"
    ).tensors
    disk = load_from_disk(expect(str(llama), Layout(), dtype="bfloat16")).tensors
    for name, tensor in disk.items():
        assert torch.equal(mapped[name], tensor), name


def test_a_daemon_without_the_cache_s_credential_is_refused_and_loads_from_disk(
    llama, start_daemon, credential, tmp_path
) -> None:
    port = free_port()
    peer = start_peer(start_daemon, llama, tmp_path, credential(), port)
    peers = peers_file(tmp_path / "peers.json", port, weights_digests(peer))
    fresh = start_fresh(start_daemon, llama, tmp_path, credential(name="another-cache"), peers)
    assert_served_from_disk(fresh, llama, "refused (credential)")
    assert "seed refused" in peer.output()


def test_a_peer_holding_other_weights_is_refused_whatever_the_peers_file_says(
    llama, start_daemon, credential, tmp_path
) -> None:
    key, port = credential(), free_port()
    peer = start_peer(start_daemon, llama, tmp_path, key, port, dtype="float32")
    # The peers file claims the peer holds bfloat16 weights; the peer knows better.
    bf16 = start_daemon(llama, name="probe", dtype="bfloat16", keeper="off", socket_dir_override=str(tmp_path / "p"))
    peers = peers_file(tmp_path / "peers.json", port, weights_digests(bf16))
    bf16.stop()
    fresh = start_fresh(start_daemon, llama, tmp_path, key, peers)
    assert_served_from_disk(fresh, llama, "refused (weights)")
    assert status(peer).weights_digest != status(fresh).weights_digest


def test_a_trickling_peer_is_given_up_after_one_stall_window(llama, start_daemon, credential, tmp_path) -> None:
    key, port = credential(), free_port()
    peer = start_peer(start_daemon, llama, tmp_path, key, port, seed_max_mib_s=0.05)
    peers = peers_file(tmp_path / "peers.json", port, weights_digests(peer))
    fresh = start_fresh(start_daemon, llama, tmp_path, key, peers, seed_stall_seconds=1.0, seed_min_mib_s=1.0)
    assert_served_from_disk(fresh, llama, "slower than")
    assert status(fresh).seed.seconds < 10


def test_a_peer_killed_mid_transfer_costs_a_bounded_wait_then_the_disk(
    llama, start_daemon, credential, tmp_path
) -> None:
    key, port = credential(), free_port()
    first = start_peer(start_daemon, llama, tmp_path, key, port)
    arena = status(first).arena_bytes
    first.stop()
    # Paced to take ~6 s, so the kill lands in the middle of it.
    peer = start_peer(start_daemon, llama, tmp_path, key, port, seed_max_mib_s=arena / 6 / 2**20)
    peers = peers_file(tmp_path / "peers.json", port, weights_digests(peer))
    fresh = start_fresh(
        start_daemon, llama, tmp_path, key, peers, wait=False, seed_stall_seconds=2.0, seed_min_mib_s=0.01
    )
    wait_for(lambda: "seeding" in peer.output(), 60, interval=0.05, describe="the seed to begin")
    peer.stop(signal.SIGKILL)
    wait_for(lambda: fresh.files[0].read_ready() is not None, 120, interval=0.05, describe="the fresh daemon ready")
    assert_served_from_disk(fresh, llama, "closed the connection", "connection failed", "cannot connect")


@pytest.fixture
def lying_peer(llama, start_daemon, credential, tmp_path):
    """A real seed server whose arena had one byte changed after its chunk digests were taken (what
    a memory corruption or a lying peer looks like from outside): the bytes of a real daemon's
    arena, its real fingerprint and manifest."""
    key, port = credential(), free_port()
    source = start_daemon(llama, name="faults", dtype="bfloat16", keeper="off", socket_dir_override=str(tmp_path / "s"))
    served = served_copy(source, "lying")
    arena = served.arena
    served.chunk_digests = ArenaBytes(arena, arena.size).digests(CHUNK_BYTES)
    arena.buffer()[arena.size // 2] ^= 0xFF
    server = SeedServer(served, ("127.0.0.1", port), key).start()
    yield key, peers_file(tmp_path / "peers.json", port, {0: served.fingerprint.weights_digest}), server
    server.stop()
    source.stop()


def test_a_chunk_that_does_not_match_its_digest_discards_the_copy(llama, start_daemon, tmp_path, lying_peer) -> None:
    key, peers, server = lying_peer
    fresh = start_fresh(start_daemon, llama, tmp_path, key, peers)
    assert_served_from_disk(fresh, llama, "does not match the digest")
    assert server.bytes_sent > 0  # it did send, and what it sent was refused
