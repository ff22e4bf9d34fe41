"""A daemon whose loaded model takes more than half of the GPU (a 60 GiB model on an 80 GB GPU) cannot
also hold a second copy in its new arena: it publishes through host memory, giving the model's GPU
memory back first, and the cuda-vmm arena holds every byte of every tensor.

Marked ``gpu``: skipped without CUDA, run on the device machine with ``make gpu``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from weightcache.engine_profiles.publish import publish

pytestmark = pytest.mark.gpu
CHUNK = 2**30


def chunk(i: int, n: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(i)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)


def test_a_model_of_six_tenths_of_the_free_gpu_memory_is_published_whole() -> None:
    free, _ = torch.cuda.mem_get_info(0)
    sizes = [CHUNK] * (int(free * 0.6) // CHUNK) + [12345]
    model = nn.Module()
    for i, n in enumerate(sizes):
        model.register_buffer(f"w{i}", chunk(i, n))
    published = publish(model, "digest", "test/rank-0", "cuda-vmm", 0)
    try:
        assert all(t.untyped_storage().nbytes() == 0 for t in model.buffers())  # the loaded copy was given back
        views = published.manifest.views(published.arena.buffer())
        for i, n in enumerate(sizes):
            assert torch.equal(views[f"w{i}"], chunk(i, n)), f"w{i}"
        assert published.arena.size >= sum(sizes)
    finally:
        published.arena.close()
