"""Tensor parallel 2 over a Qwen3 with one KV head: SGLang replicates the head on both ranks, the
``sglang``-profile daemon (two ranks, one process each, in one gloo world) publishes each rank's
own replica (its qkv_proj: half the query heads and the whole KV head), and an SGLang server at
``--tp-size 2`` that may not load from disk (``fallback: error``) maps both ranks and generates,
greedily, the tokens SGLang generates from disk at TP=2. From disk at TP=2, not TP=1: the ranks'
partial sums are reduced in another order than one rank's, which may flip a greedy near-tie."""

from __future__ import annotations

import re
from pathlib import Path

from sglang_harness import generated, qwen3_checkpoint, sglang_args, start_daemon
from weightcache.client.weights import DaemonConnection


def test_each_rank_maps_its_replica_of_the_one_kv_head_and_sglang_generates_as_from_disk(
    tmp_path: Path, calls: Path
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3-one-kv-head", num_kv_heads=1), sglang_args(tp=2)
    daemon = start_daemon(model, tmp_path / "sockets", "tp2", args, logs=tmp_path, calls=calls, tp=2)
    try:
        daemon.wait_ready()
        held = []
        for rank in (0, 1):
            with DaemonConnection(daemon.files(rank).socket) as conn:
                held.append(conn.query_config().fingerprint)
        assert [(f.tp_size, f.tp_rank) for f in held] == [(2, 0), (2, 1)]
        cache = {"name": "tp2", "socket_dir": str(tmp_path / "sockets"), "fallback": "error"}
        from_cache = generated(model, args, log=tmp_path / "cache.log", calls=calls, cache=cache, tp=2)
        log = (tmp_path / "cache.log").read_text()
        # Each rank bound its own arena, none fell back to disk.
        assert sorted(re.findall(r"weightcache 'tp2' rank (\d)", log)) == ["0", "1"], log[-4000:]
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    from_disk = generated(model, args, log=tmp_path / "disk.log", calls=calls, tp=2)
    assert from_cache == from_disk
    assert len({tuple(t) for t in from_disk}) > 1 and all(len(t) == 12 for t in from_disk)  # not degenerate
