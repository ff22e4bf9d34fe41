"""Each tensor-parallel rank maps its own arena (its q/k/v and gate/up slices, its vocabulary rows) and vLLM answers as from disk."""

from pathlib import Path

from vllm_harness import assert_cache_matches_disk, qwen3_checkpoint, vllm_args


def test_each_tensor_parallel_rank_maps_its_own_arena_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    assert_cache_matches_disk(tmp_path, model, vllm_args(tp=2, dtype="bfloat16"), "tp2", tp=2)
