"""A rank's socket file is there but no daemon listens (its daemon was SIGKILLed and left its files):
an engine with ``fallback: error`` refuses to start, naming the stale socket, the dead daemon's pid
and the fix (restart the daemon); with ``fallback: disk`` it loads from disk and logs the same."""

import os
import signal
from pathlib import Path

import pytest
from vllm_harness import Engine, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache_contract.launch import REFERENCE_PROFILE


def test_a_socket_left_by_a_killed_daemon_is_named_with_the_fix(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    # The reference profile leaves the same files and starts in seconds; which profile does not matter here.
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", [], logs=tmp_path, profile=REFERENCE_PROFILE)
    daemon.wait_ready()
    pid = daemon.files(0).read_ready().pid
    os.killpg(daemon.proc.pid, signal.SIGKILL)
    daemon.proc.wait()
    assert daemon.files(0).socket.exists()  # left behind

    log = tmp_path / "engine-error.log"
    with pytest.raises(RuntimeError, match="left behind by a daemon that no longer runs"):
        Engine(model, args, cache=cache_config(daemon, fallback="error"), log=log)
    text = log.read_text()
    assert f"no daemon listens on {daemon.files(0).socket}" in text
    assert f"(pid {pid}, its ready file says)" in text and "restart the daemon" in text

    log = tmp_path / "engine-disk.log"
    with Engine(model, args, cache=cache_config(daemon, fallback="disk"), log=log) as engine:
        assert [r["mode"] for r in engine.report()] == ["disk"]
        assert len(engine.generate()) == 3
    assert "loading from disk" in log.read_text() and "left behind by a daemon" in log.read_text()
