"""A transformers model bound to the cache is bit-identical to the same model loaded by transformers."""

from pathlib import Path

import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import load_weights
from weightcache.tools.reference_hf import bound_hf_model, greedy, oracle_hf_model

PROMPT = [3, 17, 101, 7, 250, 42, 9]


@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_cache_bound_model_matches_transformers_bit_for_bit(
    checkpoint_factory, start_daemon, family: str, tied: bool
) -> None:
    ckpt: Path = checkpoint_factory(family=family, tie_word_embeddings=tied)
    daemon = start_daemon(ckpt, dtype="bfloat16")
    cached = load_weights(
        str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
    )
    disk = load_weights(str(ckpt), Layout(), socket_dir=None, name=None, dtype="bfloat16")
    assert (cached.mode, disk.mode) == ("cache", "disk")
    assert bool(cached.aliases) == tied

    oracle = oracle_hf_model(ckpt, "bfloat16")
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        want = oracle(ids).logits
        for weights in (cached, disk):
            model = bound_hf_model(ckpt, weights)
            got = model(ids).logits
            assert got.dtype == want.dtype and torch.equal(got, want), f"{weights.mode} logits differ"
            assert greedy(model, PROMPT, 12) == greedy(oracle, PROMPT, 12)
