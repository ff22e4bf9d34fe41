"""float32 at TP=1: plain F.linear from the cache gives the greedy tokens of vLLM's default path from
disk, which for float32 on this CPU is oneDNN (for bf16, vLLM itself falls back to F.linear on CPUs
without AVX-512 BF16 oneDNN kernels, so the bf16 tests compare F.linear with F.linear here)."""

from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, from_disk, qwen3_checkpoint, start_daemon, vllm_args


def test_float32_vllm_from_the_cache_gives_the_greedy_tokens_of_vllms_onednn_path_from_disk(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args(tp=1, dtype="float32")
    expected = from_disk(model, args, tp=1)
    daemon = start_daemon(model, tmp_path / "sockets", "fp32-tp1", args, logs=tmp_path, tp=1)
    try:
        daemon.wait_ready()
        with Engine(model, args, tp=1, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            assert_zero_copy(engine.report(), tp=1)
    finally:
        daemon.stop()
