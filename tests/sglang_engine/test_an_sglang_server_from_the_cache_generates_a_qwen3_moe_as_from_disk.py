"""A tiny Qwen3-MoE (8 experts, top-2, every layer sparse) in float32, at TP=1 and TP=2 (each rank
holds its slice of every expert): the ``sglang``-profile daemon publishes each rank's fused expert
weights as SGLang's CPU path post-processed them, and an SGLang server that may not load from disk
(``fallback: error``) maps every rank and generates, greedily, the tokens SGLang generates from disk
at the same TP. float32: in bf16 SGLang's greedy ids diverge from HF's at a near-tie, in float32
they equal HF's, so the comparison is of weights, not of rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
from sglang_harness import generated, qwen3_moe_checkpoint, sglang_args, start_daemon
from weightcache.client.weights import DaemonConnection


# TP=2 passed here too (each rank maps its slice of the fused experts; 5 minutes on this machine):
# `make test` keeps TP=1 for CI's time, and TP=2 is tested on the dense model.
@pytest.mark.parametrize("tp", [1])
def test_the_cache_holds_sglangs_fused_experts_and_sglang_generates_as_from_disk(
    tmp_path: Path, calls: Path, tp: int
) -> None:
    model, args = qwen3_moe_checkpoint(tmp_path / "qwen3-moe"), sglang_args(tp=tp, dtype="float32")
    daemon = start_daemon(model, tmp_path / "sockets", "moe", args, logs=tmp_path, calls=calls, tp=tp)
    try:
        daemon.wait_ready()
        for rank in range(tp):
            with DaemonConnection(daemon.files(rank).socket) as conn:
                held = conn.query_config().fingerprint
            assert (held.dtype, held.tp_rank, held.engine and held.engine.settings["architecture"]) == (
                "float32",
                rank,
                "Qwen3MoeForCausalLM",
            )
        cache = {"name": "moe", "socket_dir": str(tmp_path / "sockets"), "fallback": "error"}
        from_cache = generated(model, args, log=tmp_path / "cache.log", calls=calls, cache=cache, tp=tp)
        assert (tmp_path / "cache.log").read_text().count("Mapping and binding weights took") == tp
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    from_disk = generated(model, args, log=tmp_path / "disk.log", calls=calls, tp=tp)
    assert from_cache == from_disk
    assert len({tuple(t) for t in from_disk}) > 1 and all(len(t) == 12 for t in from_disk)  # not degenerate
