"""A Qwen3-MoE at TP=2: each rank maps vLLM's fused expert weights (w13/w2, as its CPU kernel packed
them) and answers as vLLM from disk."""

from pathlib import Path

from vllm_harness import (
    Engine,
    assert_zero_copy,
    cache_config,
    from_disk,
    qwen3_moe_checkpoint,
    start_daemon,
    vllm_args,
)


def test_moe_ranks_map_vllms_fused_experts_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model, args = qwen3_moe_checkpoint(tmp_path / "qwen3-moe"), vllm_args(tp=2, dtype="bfloat16")
    expected = from_disk(model, args, tp=2)
    daemon = start_daemon(model, tmp_path / "sockets", "moe-tp2", args, logs=tmp_path, tp=2)
    try:
        daemon.wait_ready()
        with Engine(model, args, tp=2, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            assert_zero_copy(engine.report(), tp=2)
    finally:
        daemon.stop()
