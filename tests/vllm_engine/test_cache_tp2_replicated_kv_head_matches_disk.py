"""Tensor parallel 2 over a model with one KV head: vLLM replicates the head on both ranks, each
rank's arena holds its own replica (its qkv_proj: half the query heads and the whole KV head), and
vLLM answers as from disk with zero copies on both ranks."""

from pathlib import Path

from vllm_harness import assert_cache_matches_disk, qwen3_checkpoint, vllm_args


def test_each_rank_maps_its_replica_of_the_one_kv_head_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3-one-kv-head", num_kv_heads=1)
    assert_cache_matches_disk(tmp_path, model, vllm_args(tp=2, dtype="bfloat16"), "tp2-one-kv-head", tp=2)
