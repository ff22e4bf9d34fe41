"""float32 at TP=1: plain F.linear from the cache gives the greedy tokens of vLLM's default path from
disk, which for float32 is oneDNN (the bf16 tests compare with vLLM from disk computing as the cache
does: oneDNN's bf16 kernels, on CPUs that have them, round otherwise; vllm_harness.from_disk)."""

from pathlib import Path

from vllm_harness import assert_cache_matches_disk, qwen3_checkpoint, vllm_args


def test_float32_vllm_from_the_cache_gives_the_greedy_tokens_of_vllms_onednn_path_from_disk(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    assert_cache_matches_disk(tmp_path, model, vllm_args(tp=1, dtype="float32"), "fp32-tp1", gemm="default")
