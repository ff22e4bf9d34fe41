import pytest
import torch

from weightcache.errors import ProtocolError
from weightcache.manifest import Manifest, TensorEntry, align, contiguous_stride, tensor_views


def entry(name: str, offset: int, shape=(4, 4), dtype="float32", nbytes=None) -> TensorEntry:
    n = 4 * shape[0] * shape[1] if nbytes is None else nbytes
    return TensorEntry(name=name, dtype=dtype, shape=shape, stride=contiguous_stride(shape), offset=offset, nbytes=n)


def test_views_alias_the_arena_without_copying() -> None:
    arena = torch.zeros(1024, dtype=torch.uint8)
    entries = (entry("a", 0), entry("b", 256), entry("c", 512, (2, 8), "bfloat16", 32))
    views = tensor_views(arena, entries)
    views["b"].fill_(1.5)
    assert torch.all(arena[256:320].view(torch.float32) == 1.5)
    assert views["c"].dtype == torch.bfloat16 and views["c"].shape == (2, 8)
    assert views["c"].data_ptr() == arena.data_ptr() + 512


@pytest.mark.parametrize(
    "entries, aliases, message",
    [
        ((entry("a", 1000),), {}, "outside the 1024-byte arena"),
        ((entry("a", -256),), {}, "outside"),
        ((entry("a", 2),), {}, "outside"),  # misaligned for float32
        ((entry("a", 0, nbytes=4),), {}, "nbytes/stride disagree"),
        ((entry("a", 0), entry("a", 256)), {}, "lists 'a' twice"),
        ((entry("a", 0),), {"b": "missing"}, "alias 'b'"),
    ],
)
def test_hostile_manifests_are_rejected(entries, aliases, message) -> None:
    with pytest.raises(ProtocolError, match=message):
        Manifest(fingerprint_digest="x", arena_bytes=1024, tensors=entries, aliases=aliases).validate_bounds()


def test_align() -> None:
    assert [align(n) for n in (0, 1, 256, 257)] == [0, 256, 256, 512]
