"""The lazy index: views made on first lookup are the eager views, and nothing is made before."""

from __future__ import annotations

import mmap
import os
import warnings

import torch
from view_checks import same_view
from weightcache.checkpoints.manifest import Manifest, TensorEntry, contiguous_stride, tensor_views

ENTRIES = [
    TensorEntry(name="w", dtype="bfloat16", shape=(4, 8), stride=(8, 1), offset=0, nbytes=64),
    TensorEntry(name="t", dtype="float32", shape=(3, 2), stride=(1, 3), offset=256, nbytes=24),  # transposed
    TensorEntry(name="s", dtype="float32", shape=(), stride=(), offset=512, nbytes=4, kind="buffer"),
    TensorEntry(
        name="e", dtype="bfloat16", shape=(2, 3, 4), stride=contiguous_stride((2, 3, 4)), offset=768, nbytes=48
    ),
    TensorEntry(name="q", dtype="float8_e4m3fn", shape=(16,), stride=(1,), offset=1024, nbytes=16),
]
ARENA = 1280


def test_a_materialised_view_is_the_eager_view_of_the_same_bytes() -> None:
    arena = torch.arange(ARENA, dtype=torch.int32).to(torch.uint8)
    manifest = Manifest.build("x", ARENA, ENTRIES)
    manifest.validate_bounds()
    index, eager = manifest.index(arena), tensor_views(arena, ENTRIES)
    for name in ("t", "q", "w", "s", "e"):  # any order: each view depends on its own entry only
        assert same_view(index[name], eager[name]), name
    assert all(same_view(v, eager[n]) for n, v in manifest.views(arena).items())


def test_names_shapes_and_dtypes_are_known_before_any_view_is_made() -> None:
    index = Manifest.build("x", ARENA, ENTRIES).index(torch.zeros(ARENA, dtype=torch.uint8))
    assert len(index) == 5 and list(index) == ["w", "t", "s", "e", "q"] and "e" in index and "z" not in index
    assert index.spec("t") == ((3, 2), torch.float32) and index.spec("s").shape == ()
    assert index.spec("q").dtype == torch.float8_e4m3fn
    assert index.materialised == 0
    assert index.get("z") is None and index.materialised == 0
    first = index["e"]
    assert index["e"] is first and index.materialised == 1  # made once, then kept


def test_views_of_a_read_only_mapping_stay_in_that_read_only_mapping() -> None:
    fd = os.memfd_create("weightcache-test")
    try:
        os.ftruncate(fd, ARENA)
        readonly = mmap.mmap(fd, ARENA, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # torch warns the buffer is not writable
            arena = torch.frombuffer(readonly, dtype=torch.uint8, count=ARENA)
        index = Manifest.build("x", ARENA, ENTRIES).index(arena)
        for name in index:
            view = index[name]
            assert view.untyped_storage().data_ptr() == arena.data_ptr()
            assert _permissions(view.data_ptr()) == "r--s", name  # a write would fault, as through the eager view
    finally:
        os.close(fd)


def _permissions(address: int) -> str:
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= address < hi:
                return perms
    raise AssertionError(f"{address:#x} is not mapped")
