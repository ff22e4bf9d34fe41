"""A Qwen3-MoE at TP=2: each rank maps vLLM's fused expert weights (w13/w2, as its CPU kernel packed
them) and answers as vLLM from disk."""

from pathlib import Path

from vllm_harness import assert_cache_matches_disk, qwen3_moe_checkpoint, vllm_args


def test_moe_ranks_map_vllms_fused_experts_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model = qwen3_moe_checkpoint(tmp_path / "qwen3-moe")
    assert_cache_matches_disk(tmp_path, model, vllm_args(tp=2, dtype="bfloat16"), "moe-tp2", tp=2)
