"""An engine profile with no plan of its own (vLLM's layout comes out of vLLM's loading) takes the
layout from the authenticated peer, but never a manifest whose tensors escape the arena, nor an
arena bigger than its checkpoint could fill: both are refused before anything is allocated."""

from __future__ import annotations

import pytest
from seeding_builders import free_port, peers_file, served_copy
from weightcache.arenas.arena import CpuShmArena
from weightcache.checkpoints.manifest import Manifest
from weightcache.seeding.client import Expected, SeedSettings, seed_rank
from weightcache.seeding.server import SeedServer


@pytest.fixture
def peer(llama, start_daemon, credential, tmp_path):
    """A real daemon's rank 0 served by a seed server of the test's own (its manifest may be bent)."""
    key = credential()
    source = start_daemon(
        llama, name="planless", dtype="bfloat16", keeper="off", socket_dir_override=str(tmp_path / "s")
    )
    served = served_copy(source, "planless")
    source.stop()
    yield key, served
    served.arena.close()


def seed(served, key: str, tmp_path, max_arena_bytes: int, manifest: Manifest | None = None):
    """Seed rank 0 with no plan from ``served`` (its manifest replaced by ``manifest``); returns
    the result and the sizes of the arenas the client asked for."""
    port = free_port()
    if manifest is not None:
        served.manifest = manifest
    server = SeedServer(served, ("127.0.0.1", port), key).start()
    made: list[int] = []

    def make(size: int) -> CpuShmArena:
        made.append(size)
        return CpuShmArena(size, "seeded")

    try:
        settings = SeedSettings(
            peers_file=peers_file(tmp_path / "peers.json", port, {0: served.fingerprint.weights_digest}),
            credential_file=key,
            node_name="node-b",
            stall_s=2.0,
        )
        expected = Expected(served.fingerprint, None, None, max_arena_bytes=max_arena_bytes)
        return seed_rank(settings, 0, expected, make), made
    finally:
        server.stop()


def test_the_peer_s_layout_is_taken_and_its_bytes_arrive_exactly(peer, tmp_path) -> None:
    key, served = peer
    result, made = seed(served, key, tmp_path, max_arena_bytes=4 * served.arena.size)
    assert result is not None and result.arena is not None, result and result.report
    assert made == [served.manifest.arena_bytes]
    assert result.manifest.entries() == served.manifest.entries()
    assert bytes(result.arena.buffer().numpy()) == bytes(served.arena.buffer().numpy())
    result.arena.close()


def test_an_arena_bigger_than_the_checkpoint_could_fill_is_refused_before_allocating(peer, tmp_path) -> None:
    key, served = peer
    result, made = seed(served, key, tmp_path, max_arena_bytes=served.arena.size - 1)
    assert result is not None and result.arena is None
    assert "more than this rank could hold" in (result.report.fallback or ""), result.report.fallback
    assert made == []


def test_a_manifest_whose_tensor_escapes_the_arena_is_refused_before_allocating(peer, tmp_path) -> None:
    key, served = peer
    entries = served.manifest.entries()
    last = entries[-1]
    entries[-1] = last.model_copy(update={"offset": served.manifest.arena_bytes - last.nbytes // 2})
    bent = Manifest.build(served.manifest.fingerprint_digest, served.manifest.arena_bytes, entries)
    result, made = seed(served, key, tmp_path, max_arena_bytes=4 * served.arena.size, manifest=bent)
    assert result is not None and result.arena is None
    assert "malformed" in (result.report.fallback or ""), result.report.fallback
    assert made == []
