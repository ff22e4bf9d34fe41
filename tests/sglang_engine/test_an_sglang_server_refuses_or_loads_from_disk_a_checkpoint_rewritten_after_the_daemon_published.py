"""The checkpoint's safetensors are rewritten after the ``sglang``-profile daemon published: other
weights (another seed) of the same shapes, so every shard keeps its size and header and only its
file identity and bytes differ. The daemon's checkpoint watch re-reads the shards, finds their
bytes changed and names them; the arena keeps the old weights. An SGLang server on the rewritten
checkpoint then computes a fingerprint with the new shard stamps (the shared engine path,
``engine_profiles.mapping``): with ``fallback: error`` it refuses to start and its log names the
changed shards and the fix (restart the daemon); with ``fallback: disk`` it loads the new weights
with SGLang's own loader and generates what SGLang generates from disk on them, not the old tokens."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from sglang_harness import Daemon, Server, generated, qwen3_checkpoint, sglang_args, start_daemon
from weightcache.client.weights import DaemonConnection
from weightcache.wire.protocol import StatusReply


def status(daemon: Daemon) -> StatusReply:
    with DaemonConnection(daemon.files().socket) as conn:
        return conn.status()


def rewrite_with(model: Path, other: Path) -> list[str]:
    """Each shard of ``model`` replaced by ``other``'s as a re-sync would: a copy, then a rename."""
    names = sorted(p.name for p in model.glob("*.safetensors"))
    for name in names:
        tmp = model / f".{name}.tmp"
        shutil.copyfile(other / name, tmp)
        tmp.replace(model / name)
    return names


def test_a_rewritten_checkpoint_is_refused_under_fallback_error_and_loaded_from_disk_under_fallback_disk(
    tmp_path: Path, calls: Path
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), sglang_args()
    new = qwen3_checkpoint(tmp_path / "qwen3-seed-1", seed=1)
    sockets = tmp_path / "sockets"
    daemon = start_daemon(model, sockets, "qwen3", args, logs=tmp_path, calls=calls, checkpoint_poll_seconds=1.0)
    try:
        daemon.wait_ready()
        cache = {"name": "qwen3", "socket_dir": str(sockets), "fallback": "error"}
        old = generated(model, args, log=tmp_path / "before.log", calls=calls, cache=cache)
        assert "Mapping and binding weights took" in (tmp_path / "before.log").read_text()

        shards = rewrite_with(model, new)
        deadline = time.monotonic() + 120
        while (watch := status(daemon).checkpoint) is None or watch.state != "changed":
            assert time.monotonic() < deadline, f"the daemon's watch did not find the change: {watch}"
            time.sleep(0.5)
        assert watch.changed_files == shards, watch

        refused = Server(model, args, log=tmp_path / "error.log", calls=calls, cache=cache)
        try:
            with pytest.raises(RuntimeError, match="SGLang exited"):
                refused.wait_healthy()
        finally:
            refused.stop()
        log = (tmp_path / "error.log").read_text()
        assert "holds different weights (differs in: shards; its checkpoint watch re-read" in log, log[-4000:]
        assert "restart the daemon so it loads the checkpoint as it is now" in log, log[-4000:]
        assert 'or set "fallback": "disk"' in log, log[-4000:]

        fallback = generated(
            model, args, log=tmp_path / "fallback.log", calls=calls, cache={**cache, "fallback": "disk"}
        )
        assert (
            "loading from disk: weightcache 'qwen3' rank 0: daemon for cache" in (tmp_path / "fallback.log").read_text()
        )
    finally:
        assert daemon.stop() == 0, daemon.log.read_text()[-4000:]
    assert fallback == generated(model, args, log=tmp_path / "disk.log", calls=calls)
    assert fallback != old
