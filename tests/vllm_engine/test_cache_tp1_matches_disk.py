"""vLLM serving a Qwen3 at TP=1 from the cache answers exactly as vLLM from disk, with zero copies."""

from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, from_disk, qwen3_checkpoint, start_daemon, vllm_args


def test_vllm_from_the_cache_gives_the_greedy_tokens_of_vllm_from_disk_and_maps_every_weight(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    expected = from_disk(model, args)
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", args, logs=tmp_path)
    try:
        daemon.wait_ready()
        with Engine(model, args, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            assert_zero_copy(engine.report(), tp=1)
    finally:
        daemon.stop()
