"""A daemon whose GPU cannot hold the loaded model and the arena at once publishes through host
memory: the arena gets the same bytes and manifest as a direct copy, and every tensor the model held
(tied ones and views of them included) is emptied before the arena is made, so the peak is one copy.
Shown on a cpu-shm arena: the mechanism is the same, the decision (free GPU memory) is the GPU's."""

import os

import torch
from torch import nn
from weightcache.arenas.arena import map_arena
from weightcache.engine_profiles.publish import publish


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(16, 8)
        self.proj = nn.Linear(8, 8, bias=False)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("cos_sin_cache", torch.arange(12, dtype=torch.float32).view(3, 4), persistent=False)


def arena_bytes(published) -> bytes:  # type: ignore[no-untyped-def]
    manifest = published.manifest
    fd = published.arena.export().fd
    mapping = map_arena("cpu-shm", manifest.arena_bytes, manifest.arena_bytes, fd, None, None)
    os.close(fd)
    return bytes(mapping.buffer.numpy())


def test_publishing_through_host_memory_empties_the_model_and_publishes_the_same_arena() -> None:
    direct = publish(Tiny(), "digest", "test/direct")
    model = Tiny()
    kept_view = model.proj.weight[:2]  # an engine's own view of a weight, as kernels keep them
    staged = publish(model, "digest", "test/staged", through_host=True)
    try:
        assert staged.manifest == direct.manifest
        assert arena_bytes(staged) == arena_bytes(direct)
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            assert tensor.untyped_storage().nbytes() == 0, name
        assert kept_view.untyped_storage().nbytes() == 0
    finally:
        staged.arena.close()
        direct.arena.close()


def test_a_direct_copy_leaves_the_model_as_it_was() -> None:
    model = Tiny()
    before = model.proj.weight.clone()
    published = publish(model, "digest", "test/direct", through_host=False)
    try:
        assert torch.equal(model.proj.weight, before)
    finally:
        published.arena.close()
