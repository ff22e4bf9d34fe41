"""A Qwen3 with tied embeddings: lm_head is the mapped embedding itself, and answers match vLLM from disk."""

from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, from_disk, qwen3_checkpoint, start_daemon, vllm_args


def test_tied_embeddings_are_mapped_once_and_vllm_answers_as_from_disk(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3-tied", tie=True), vllm_args()
    expected = from_disk(model, args)
    # The checkpoint is scaled so that greedy decoding is not one repeated token (vllm_harness).
    assert all(len(set(ids)) > 2 for ids in expected), expected
    daemon = start_daemon(model, tmp_path / "sockets", "tied", args, logs=tmp_path)
    try:
        daemon.wait_ready()
        with Engine(model, args, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            [rank] = engine.report()
            assert_zero_copy([rank], tp=1)
            assert rank["aliases"] >= 1  # lm_head.weight → model.embed_tokens.weight, one copy
    finally:
        daemon.stop()
