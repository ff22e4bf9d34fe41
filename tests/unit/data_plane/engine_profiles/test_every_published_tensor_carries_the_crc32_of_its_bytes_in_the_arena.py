"""Each manifest entry's checksum is the crc32 of that tensor's bytes in the arena, whether the tensor
was summed whole or in chunks on several threads (a tensor larger than a chunk, and one that ends
mid-chunk, one transposed), and whether the arena was filled directly or through host memory; and the
arena holds each tensor's values."""

import os
import zlib

import pytest
import torch
from torch import nn
from weightcache.arenas.arena import map_arena
from weightcache.engine_profiles import publish as publishing


def model() -> nn.Module:
    m = nn.Module()
    g = torch.Generator().manual_seed(3)
    m.register_buffer("big", torch.randint(0, 256, (10_000,), dtype=torch.uint8, generator=g))
    m.register_buffer("odd", torch.randn(333, generator=g))  # 1332 bytes: one full chunk and a part
    m.register_buffer("small", torch.randn(3, generator=g).to(torch.bfloat16))
    # Dense, not contiguous: its bytes in the arena are in its own memory order, strides kept.
    m.register_buffer("transposed", torch.randn(40, 30, generator=g).t())
    m.register_buffer("empty", torch.empty(0))
    return m


@pytest.mark.parametrize("through_host", [False, True])
def test_each_checksum_is_the_crc32_of_the_arena_bytes_it_describes(
    monkeypatch: pytest.MonkeyPatch, through_host: bool
) -> None:
    monkeypatch.setattr(publishing, "STAGING_BYTES", 1000)  # "big" spans ten chunks, "odd" two
    expected = {name: t.clone() for name, t in model().named_buffers()}
    published = publishing.publish(model(), "digest", f"test/crc-{through_host}", through_host=through_host)
    try:
        manifest = published.manifest
        fd = published.arena.export().fd
        mapping = map_arena("cpu-shm", manifest.arena_bytes, manifest.arena_bytes, fd, None, None)
        os.close(fd)
        raw = mapping.buffer.numpy()
        entries = {e.name: e for e in manifest.entries()}
        assert set(entries) == {"big", "odd", "small", "transposed", "empty"}
        assert entries["transposed"].stride == (1, 30)
        views = manifest.views(mapping.buffer)
        for name, value in expected.items():
            assert torch.equal(views[name], value), name
        for name, e in entries.items():
            assert e.checksum == zlib.crc32(raw[e.offset : e.offset + e.nbytes].tobytes()), name
        assert entries["empty"].checksum == 0
        assert entries["big"].checksum != 0
    finally:
        published.arena.close()
