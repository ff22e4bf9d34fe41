"""What a loading daemon asks the kernel to read ahead: the plan's file bytes, in its order, within a budget."""

from pathlib import Path

from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.loader import read_ranges
from weightcache.checkpoints.page_cache import available_memory, prefetch
from weightcache.checkpoints.pipeline import plan_rank
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout


def test_read_ranges_cover_every_byte_the_plan_reads_and_nothing_of_the_headers(llama: Path) -> None:
    ckpt = open_checkpoint(llama)
    plan = plan_rank(ckpt, Layout(), resolve("none", None, None), "bfloat16")
    ranges = read_ranges(ckpt, plan)
    covered: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in ranges:
        covered.setdefault(path, []).append((offset, offset + length))
    for info in ckpt.tensors.values():  # one rank of everything: every tensor is read whole
        spans = covered[str(ckpt.path / info.file)]
        assert any(a <= info.data_start and info.data_start + info.nbytes <= b for a, b in spans), info.name
    first_data = min(i.data_start for i in ckpt.tensors.values())
    assert all(offset >= first_data for _, offset, _ in ranges)
    assert len(ranges) <= len(ckpt.shards)  # neighbours in one file merge


def test_a_tensor_parallel_rank_reads_ahead_less_than_the_whole_checkpoint(llama: Path) -> None:
    ckpt = open_checkpoint(llama)
    quant = resolve("none", None, None)
    whole = sum(n for _, _, n in read_ranges(ckpt, plan_rank(ckpt, Layout(), quant, "bfloat16")))
    half = sum(n for _, _, n in read_ranges(ckpt, plan_rank(ckpt, Layout(tp_size=2, tp_rank=1), quant, "bfloat16")))
    assert half < whole


def test_prefetch_stops_at_its_budget_and_skips_files_it_cannot_open(llama: Path, tmp_path: Path) -> None:
    shard = sorted(llama.glob("*.safetensors"))[0]
    size = shard.stat().st_size
    ranges = [(str(tmp_path / "missing.safetensors"), 0, 4096), (str(shard), 0, size), (str(shard), 0, size)]
    assert prefetch(ranges, budget_bytes=size + 100) == size + 100
    assert prefetch(ranges, budget_bytes=10 * size) == 2 * size
    assert available_memory() > 0
