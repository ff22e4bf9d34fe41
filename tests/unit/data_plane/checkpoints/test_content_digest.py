"""A shard's content digest: taken while the loader reads, equal to a second read of the same
slices however they were read, and different exactly where the bytes a rank reads differ."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.content import (
    WHOLE_FILE,
    DigestCache,
    ReadDigests,
    current_digest,
    digest_shard,
    is_whole_file,
)
from weightcache.checkpoints.loader import fill
from weightcache.checkpoints.pipeline import plan_rank
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout


def loaded_digests(path: Path, layout: Layout, dtype: str, quantization: str = "none") -> tuple[dict[str, str], list]:
    ckpt = open_checkpoint(path)
    quant = resolve(quantization, ckpt.quantization_config, None)
    plan = plan_rank(ckpt, layout, quant, dtype)
    digests = ReadDigests()
    arena = torch.zeros(plan.arena_bytes, dtype=torch.uint8)
    fill(ckpt, plan, arena, quant.weight_block_size, digests=digests)
    ckpt.close()
    return digests.by_shard(ckpt, plan.tasks), plan.tasks


@pytest.mark.parametrize(
    ("layout", "dtype", "quantization"),
    [
        (Layout(), "bfloat16", "none"),  # straight into the arena
        (Layout(), "float32", "none"),  # through safetensors, then cast
        (Layout(tp_size=2, tp_rank=1), "bfloat16", "none"),  # row-parallel weights: column slices
        (Layout(tp_size=2, tp_rank=0), "bfloat16", "fp8"),  # quantized by the daemon
    ],
    ids=["direct", "cast", "column-slices", "fp8"],
)
def test_the_digests_taken_while_loading_equal_a_second_read_of_the_same_slices(
    llama: Path, layout: Layout, dtype: str, quantization: str
) -> None:
    loaded, tasks = loaded_digests(llama, layout, dtype, quantization)
    ckpt = open_checkpoint(llama)
    assert set(loaded) == {s.name for s in ckpt.shards}
    for shard in ckpt.shards:
        assert digest_shard(llama / shard.name, shard, ckpt.tensors, tasks) == loaded[shard.name]


def test_a_changed_byte_changes_its_shards_digest_and_an_equal_copy_does_not(llama: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(llama, copy)
    loaded, tasks = loaded_digests(copy, Layout(), "bfloat16")
    first, last = sorted(copy.glob("*.safetensors"))[0], sorted(copy.glob("*.safetensors"))[-1]
    shutil.copyfile(llama / last.name, last)  # equal bytes, new stamp
    with first.open("r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0xFF]))
    ckpt = open_checkpoint(copy)
    now = {s.name: digest_shard(copy / s.name, s, ckpt.tensors, tasks) for s in ckpt.shards}
    assert now[last.name] == loaded[last.name]
    assert now[first.name] != loaded[first.name]
    assert [n for n in now if now[n] != loaded[n]] == [first.name]


def test_a_shard_replaced_between_its_stamp_and_its_read_gives_no_digest(llama: Path, tmp_path: Path) -> None:
    copy = tmp_path / "ckpt"
    shutil.copytree(llama, copy)
    _, tasks = loaded_digests(copy, Layout(), "bfloat16")
    ckpt = open_checkpoint(copy)
    shard = ckpt.shards[0]
    shutil.copyfile(llama / shard.name, copy / shard.name)  # the stamp taken above is stale now
    assert digest_shard(copy / shard.name, shard, ckpt.tensors, tasks) is None


def test_the_digest_cache_returns_what_was_put_under_the_files_identity(llama: Path, tmp_path: Path) -> None:
    ckpt = open_checkpoint(llama)
    cache = DigestCache(tmp_path)
    shard = ckpt.shards[0]
    key = DigestCache.key(llama / shard.name, shard, [], ckpt.tensors)
    assert cache.get(key) is None
    cache.put({key: "sha256:abc"})
    assert DigestCache(tmp_path).get(key) == "sha256:abc"


def test_a_whole_file_digest_is_its_own_kind_and_tells_an_equal_copy_from_a_changed_byte(
    llama: Path, tmp_path: Path
) -> None:
    """``tasks=None`` (the vLLM profile's arenas): SHA-256 of the whole file, never taken for a
    sliced digest, with its own digest-cache key; every byte counts, header and tails included."""
    copy = tmp_path / "ckpt"
    shutil.copytree(llama, copy)
    ckpt = open_checkpoint(copy)
    shard = ckpt.shards[0]
    path = copy / shard.name
    whole = digest_shard(path, shard, ckpt.tensors, None)
    assert whole == f"{WHOLE_FILE}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
    assert is_whole_file(whole) and not is_whole_file(digest_shard(path, shard, ckpt.tensors, []))
    assert DigestCache.key(path, shard, None, ckpt.tensors) != DigestCache.key(path, shard, [], ckpt.tensors)

    shutil.copyfile(llama / shard.name, path)  # equal bytes under a new stamp: the old one is stale
    assert digest_shard(path, shard, ckpt.tensors, None) is None
    now = open_checkpoint(copy).shards[0]
    digest, read = current_digest(path, now, {}, None, DigestCache(tmp_path))
    assert (digest, read) == (whole, now.size)
    assert current_digest(path, now, {}, None, DigestCache(tmp_path)) == (whole, 0)  # from the node's cache

    with path.open("r+b") as fh:
        fh.seek(-1, os.SEEK_END)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([byte[0] ^ 0xFF]))
    changed = open_checkpoint(copy).shards[0]
    assert digest_shard(path, changed, {}, None) not in (None, whole)
