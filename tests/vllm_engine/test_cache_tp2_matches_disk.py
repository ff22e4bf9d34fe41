"""Each tensor-parallel rank maps its own arena (its q/k/v and gate/up slices, its vocabulary rows) and vLLM answers as from disk."""

from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, from_disk, qwen3_checkpoint, start_daemon, vllm_args


def test_each_tensor_parallel_rank_maps_its_own_arena_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args(tp=2, dtype="bfloat16")
    expected = from_disk(model, args, tp=2)
    daemon = start_daemon(model, tmp_path / "sockets", "tp2", args, logs=tmp_path, tp=2)
    try:
        daemon.wait_ready()
        with Engine(model, args, tp=2, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            assert_zero_copy(engine.report(), tp=2)
    finally:
        daemon.stop()
