"""vLLM serving a Qwen3 at TP=1 from the cache answers exactly as vLLM from disk, with zero copies."""

from pathlib import Path

from vllm_harness import assert_cache_matches_disk, qwen3_checkpoint, vllm_args


def test_vllm_from_the_cache_gives_the_greedy_tokens_of_vllm_from_disk_and_maps_every_weight(tmp_path: Path) -> None:
    assert_cache_matches_disk(tmp_path, qwen3_checkpoint(tmp_path / "qwen3"), vllm_args(), "qwen3")
