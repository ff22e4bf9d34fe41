"""An SGLang server started with ``--load-format weightcache`` maps its rank from an ``sglang``-profile
daemon (which loaded and post-processed it with SGLang's own loader) and generates, greedily, the
same tokens as an SGLang server loading the same checkpoint from disk; with ``fallback: error`` it
could not have loaded from disk instead, and its log says it bound the mapped weights. Without a
daemon, ``fallback: disk`` loads the same tokens from disk and names the fix."""

from __future__ import annotations

from pathlib import Path

from sglang_harness import generated, qwen3_checkpoint, sglang_args, start_daemon


def test_tp1_from_the_cache_matches_disk(tmp_path: Path, calls: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), sglang_args()
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", args, logs=tmp_path, calls=calls)
    try:
        daemon.wait_ready()
        cache = {"name": "qwen3", "socket_dir": str(tmp_path / "sockets"), "fallback": "error"}
        from_cache = generated(model, args, log=tmp_path / "cache.log", calls=calls, cache=cache)
        assert "Mapping and binding weights took" in (tmp_path / "cache.log").read_text()
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    from_disk = generated(model, args, log=tmp_path / "disk.log", calls=calls)
    assert from_cache == from_disk
    assert len({tuple(t) for t in from_disk}) > 1 and all(len(t) == 12 for t in from_disk)  # not degenerate
    # With the daemon gone, fallback: disk loads with SGLang's own loader and says why.
    fallback = {"name": "qwen3", "socket_dir": str(tmp_path / "sockets"), "fallback": "disk"}
    assert generated(model, args, log=tmp_path / "fallback.log", calls=calls, cache=fallback) == from_disk
    assert "start its daemon (weightcache daemon --profile sglang)" in (tmp_path / "fallback.log").read_text()
