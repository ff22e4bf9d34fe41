"""A tiny Qwen3-MoE (8 experts, top-2, every layer sparse) in float32: the ``sglang``-profile daemon
publishes SGLang's fused expert weights as its CPU path post-processed them, and an SGLang server
that may not load from disk (``fallback: error``) maps them and generates, greedily, the tokens
SGLang generates from disk. float32: in bf16 SGLang's greedy ids diverge from HF's at a near-tie,
in float32 they equal HF's, so the comparison is of weights, not of rounding."""

from __future__ import annotations

from pathlib import Path

from sglang_harness import generated, qwen3_moe_checkpoint, sglang_args, start_daemon
from weightcache.client.weights import DaemonConnection


def test_the_cache_holds_sglangs_fused_experts_and_sglang_generates_as_from_disk(tmp_path: Path, calls: Path) -> None:
    model, args = qwen3_moe_checkpoint(tmp_path / "qwen3-moe"), sglang_args(dtype="float32")
    daemon = start_daemon(model, tmp_path / "sockets", "moe", args, logs=tmp_path, calls=calls)
    try:
        daemon.wait_ready()
        with DaemonConnection(daemon.files().socket) as conn:
            held = conn.query_config().fingerprint
        assert (held.dtype, held.engine and held.engine.settings["architecture"]) == ("float32", "Qwen3MoeForCausalLM")
        cache = {"name": "moe", "socket_dir": str(tmp_path / "sockets"), "fallback": "error"}
        from_cache = generated(model, args, log=tmp_path / "cache.log", calls=calls, cache=cache)
        assert "Mapping and binding weights took" in (tmp_path / "cache.log").read_text()
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    from_disk = generated(model, args, log=tmp_path / "disk.log", calls=calls)
    assert from_cache == from_disk
    assert len({tuple(t) for t in from_disk}) > 1 and all(len(t) == 12 for t in from_disk)  # not degenerate
