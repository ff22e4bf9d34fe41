"""The chunk digests a peer offers are the SHA-256 of each chunk in order, whether one thread hashes
them or several: a seed from a peer with more cores verifies against the same list."""

from __future__ import annotations

import hashlib
import os

from weightcache.arenas.arena import CpuShmArena
from weightcache.seeding.arena_bytes import ArenaBytes, chunk_spans

CHUNK = 2**20


def test_four_threads_give_the_digests_of_one_in_chunk_order() -> None:
    size = 7 * CHUNK + 12345  # a short last chunk
    arena = CpuShmArena(size, "digests")
    try:
        payload = os.urandom(size)
        arena.buffer().numpy()[:] = memoryview(payload)
        expected = [hashlib.sha256(payload[o : o + n]).hexdigest() for o, n in chunk_spans(size, CHUNK)]

        assert ArenaBytes(arena, size).digests(CHUNK, threads=1) == expected
        assert ArenaBytes(arena, size).digests(CHUNK, threads=4) == expected
    finally:
        arena.close()
