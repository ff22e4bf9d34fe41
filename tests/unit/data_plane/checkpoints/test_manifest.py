import numpy as np
import pytest
import torch
from weightcache.checkpoints.manifest import Manifest, TensorEntry, align, contiguous_stride, tensor_views
from weightcache.wire.protocol import REPLY, FetchReply, decode, encode
from weightcache_contract.errors import ProtocolError


def entry(name: str, offset: int, shape=(4, 4), dtype="float32", nbytes=None) -> TensorEntry:
    n = 4 * shape[0] * shape[1] if nbytes is None else nbytes
    return TensorEntry(name=name, dtype=dtype, shape=shape, stride=contiguous_stride(shape), offset=offset, nbytes=n)


ENTRIES = [
    entry("a", 0),
    entry("b", 256),
    TensorEntry(name="c", dtype="bfloat16", shape=(2, 8), stride=(8, 1), offset=512, nbytes=32, checksum=7),
    TensorEntry(name="s", dtype="float32", shape=(), stride=(), offset=768, nbytes=4, kind="buffer"),
]


def test_views_alias_the_arena_without_copying() -> None:
    arena = torch.zeros(1024, dtype=torch.uint8)
    manifest = Manifest.build("x", 1024, ENTRIES)
    manifest.validate_bounds()
    views = manifest.views(arena)
    views["b"].fill_(1.5)
    assert torch.all(arena[256:320].view(torch.float32) == 1.5)
    assert views["c"].dtype == torch.bfloat16 and views["c"].shape == (2, 8)
    assert views["c"].data_ptr() == arena.data_ptr() + 512
    assert views["s"].shape == () and views["s"].data_ptr() == arena.data_ptr() + 768
    assert all(torch.equal(views[n], v) for n, v in tensor_views(arena, ENTRIES).items())


def test_columnar_manifest_round_trips_through_the_wire() -> None:
    manifest = Manifest.build("x", 1024, ENTRIES, {"tied": "a"})
    decoded = decode(REPLY, encode(FetchReply(backend="cpu-shm", manifest=manifest, mapping_bytes=1024))[4:]).manifest
    assert decoded.entries() == ENTRIES and decoded.aliases == {"tied": "a"}


@pytest.mark.parametrize(
    "entries, aliases, message",
    [
        ([entry("a", 1000)], {}, "'a' lies outside the 1024-byte arena"),
        ([entry("a", -256)], {}, "outside"),
        ([entry("a", 2)], {}, "outside"),  # misaligned for float32
        ([entry("a", 0, nbytes=4)], {}, "nbytes/stride disagree"),
        ([entry("a", 0), entry("a", 256)], {}, "lists 'a' twice"),
        ([entry("a", 0)], {"b": "missing"}, "alias 'b'"),
        ([entry("a", 0, shape=(2**40, 2**40), nbytes=0)], {}, "outside"),  # overflowing element count
    ],
)
def test_hostile_manifests_are_rejected(entries, aliases, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        Manifest.build("x", 1024, entries, aliases).validate_bounds()


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("offsets", np.zeros(3, "<i8").tobytes(), "inconsistent lengths"),
        ("dtype_codes", bytes([0, 9, 0, 0]), "dtype code out of range"),
        ("kinds", bytes([0, 0, 5, 0]), "kind out of range"),
        ("dims", np.array([4, 4, 4, -4, 2, 8], "<i8").tobytes(), "negative dimension"),
    ],
)
def test_malformed_columns_are_rejected(column: str, value: bytes, message: str) -> None:
    manifest = Manifest.build("x", 1024, ENTRIES).model_copy(update={column: value})
    with pytest.raises(ProtocolError, match=message):
        manifest.validate_bounds()


def test_align() -> None:
    assert [align(n) for n in (0, 1, 256, 257)] == [0, 256, 256, 512]
