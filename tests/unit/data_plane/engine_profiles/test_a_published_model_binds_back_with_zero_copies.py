"""A model's post-processed tensors go into one sealed arena and come back as views of its mapping.

No engine here: publishing and binding only move tensors; tests/vllm_engine runs them inside real vLLM."""

import os

import pytest
import torch
from torch import nn
from weightcache.arenas.arena import map_arena
from weightcache.engine_profiles.bind import bind_arena, check_bound, outside_mapping
from weightcache.engine_profiles.publish import publish
from weightcache_contract.errors import WeightCacheError


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight  # tied, as with tie_word_embeddings
        self.register_buffer("cos_sin_cache", torch.arange(12, dtype=torch.float32).view(3, 4), persistent=False)
        self.register_buffer("_k_scale", torch.tensor(1.0))


def test_published_tensors_bind_as_views_of_the_mapping_with_ties_kept_and_written_scalars_copied() -> None:
    source = Tiny()
    published = publish(source, "digest", "test/rank-0")
    manifest = published.manifest
    assert manifest.aliases == {"head.weight": "embed.weight"}
    assert manifest.kinds_by_name()["cos_sin_cache"] == "buffer"

    fd = published.arena.export().fd
    mapping = map_arena("cpu-shm", manifest.arena_bytes, manifest.arena_bytes, fd, None, None)
    os.close(fd)
    with torch.device("meta"):
        target = Tiny()
    bound = bind_arena(
        target, manifest.views(mapping.buffer), manifest.kinds_by_name(), manifest.aliases, frozenset({"_k_scale"})
    )
    check_bound(target)

    assert target.head.weight is target.embed.weight
    assert torch.equal(target.proj.weight, source.proj.weight) and torch.equal(
        target.cos_sin_cache, source.cos_sin_cache
    )
    assert (bound.private, bound.private_bytes) == (1, 4)
    assert outside_mapping(target, *mapping.address_range) == ["_k_scale"]
    published.arena.close()


def test_without_written_names_every_tensor_is_a_view_of_the_mapping() -> None:
    published = publish(Tiny(), "digest", "test/rank-0")
    manifest = published.manifest
    fd = published.arena.export().fd
    mapping = map_arena("cpu-shm", manifest.arena_bytes, manifest.arena_bytes, fd, None, None)
    os.close(fd)
    with torch.device("meta"):
        target = Tiny()
    bound = bind_arena(target, manifest.views(mapping.buffer), manifest.kinds_by_name(), manifest.aliases)
    assert (bound.private, bound.mapped) == (0, len(manifest))
    assert outside_mapping(target, *mapping.address_range) == []
    published.arena.close()


def test_publishing_refuses_cuda_ipc_and_tensors_of_another_device_by_name() -> None:
    with pytest.raises(WeightCacheError, match="cuda-ipc handle names memory of this process's CUDA context"):
        publish(Tiny(), "digest", "test/rank-0", backend="cuda-ipc")
    with torch.device("meta"):
        on_meta = Tiny()
    with pytest.raises(WeightCacheError, match="embed.weight is on meta; a cpu-shm arena on cpu holds"):
        publish(on_meta, "digest", "test/rank-0")
