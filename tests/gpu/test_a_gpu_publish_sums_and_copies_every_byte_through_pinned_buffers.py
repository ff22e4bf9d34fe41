"""On a GPU, a publish moves bytes through each thread's pinned buffer: the checksums read back from a
direct ``cuda-vmm`` arena, and the host copy and upload of one made through host memory. Whether the
pieces are smaller than a tensor (ten of them in one, a part of one in another) or a tensor spans
several whole buffers, each manifest checksum is the crc32 of that tensor's bytes in the arena, and the
arena holds every tensor's values, a transposed one in its own memory order.

Marked ``gpu``: skipped without CUDA, run on the device machine with ``make gpu``.
"""

from __future__ import annotations

import zlib

import pytest
import torch
from torch import nn
from weightcache.checkpoints.staging import STAGING_BYTES
from weightcache.engine_profiles import publish as publishing

pytestmark = pytest.mark.gpu


def model() -> nn.Module:
    m = nn.Module()
    g = torch.Generator(device="cuda").manual_seed(5)
    m.register_buffer("big", torch.randint(0, 256, (10_000,), dtype=torch.uint8, device="cuda", generator=g))
    m.register_buffer("odd", torch.randn(333, device="cuda", generator=g))
    m.register_buffer("transposed", torch.randn(40, 30, device="cuda", generator=g).t())
    # Two and a half pinned buffers' worth, in the buffers' own size.
    m.register_buffer(
        "wide", torch.randint(0, 256, (5 * STAGING_BYTES // 2,), dtype=torch.uint8, device="cuda", generator=g)
    )
    m.register_buffer("empty", torch.empty(0, device="cuda"))
    return m


@pytest.mark.parametrize("through_host", [False, True])
@pytest.mark.parametrize("piece", [1000, STAGING_BYTES])
def test_each_checksum_is_the_crc32_of_the_gpu_arena_bytes_it_describes(
    monkeypatch: pytest.MonkeyPatch, through_host: bool, piece: int
) -> None:
    monkeypatch.setattr(publishing, "STAGING_BYTES", piece)
    m = model()
    expected = {name: t.clone() for name, t in m.named_buffers()}
    published = publishing.publish(m, "digest", f"test/gpu-crc-{through_host}-{piece}", "cuda-vmm", 0, through_host)
    try:
        manifest = published.manifest
        flat = published.arena.buffer()
        entries = {e.name: e for e in manifest.entries()}
        assert entries["transposed"].stride == (1, 30)
        for name, e in entries.items():
            assert e.checksum == zlib.crc32(flat[e.offset : e.offset + e.nbytes].cpu().numpy().data), name
        views = manifest.views(flat)
        for name, value in expected.items():
            assert torch.equal(views[name], value), name
        if through_host:
            assert all(t.untyped_storage().nbytes() == 0 for t in m.buffers())  # the loaded copy was given back
    finally:
        published.arena.close()
