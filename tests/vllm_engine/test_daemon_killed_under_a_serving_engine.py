"""The vLLM-profile daemon SIGKILLed under a serving vLLM engine: the engine's answers go on
unchanged (it holds its own mapping); a restarted daemon re-adopts the arena from the keeper without
reading a weight byte; a new engine maps it again and answers the same."""

import os
import signal
import time
from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.client.weights import DaemonConnection


def status(daemon, rank: int = 0):
    with DaemonConnection(daemon.files(rank).socket) as conn:
        return conn.status()


def wait_for(condition, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_a_killed_daemon_leaves_the_engine_serving_and_its_successor_readopts_from_the_keeper(
    tmp_path: Path, socket_dir: str, start_keeper
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    sockets = Path(socket_dir)
    start_keeper()
    first = start_daemon(model, sockets, "qwen3", args, logs=tmp_path)
    second = None
    try:
        first.wait_ready()
        wait_for(lambda: status(first).deposited, what="the keeper deposit")
        assert status(first).disk_bytes_read > 0 and not status(first).adopted
        with Engine(model, args, cache=cache_config(first), log=tmp_path / "engine-1.log") as engine:
            before = engine.generate()
            os.killpg(first.proc.pid, signal.SIGKILL)  # the launcher and its rank, no clean-up
            first.proc.wait()
            assert engine.generate() == before  # the engine's mapping outlives the daemon

            second = start_daemon(model, sockets, "qwen3", args, logs=tmp_path)
            second.wait_ready()
            st = status(second)
            assert st.adopted and st.disk_bytes_read == 0, second.log.read_text()[-3000:]
            assert second.files(0).read_ready().adopted
            assert engine.generate() == before
        # One vLLM engine at a time: the new one starts after the old one is gone.
        with Engine(model, args, cache=cache_config(second), log=tmp_path / "engine-2.log") as engine:
            assert engine.generate() == before
            assert_zero_copy(engine.report(), tp=1)
    finally:
        for daemon in (first, second):
            if daemon is not None and daemon.proc.poll() is None:
                daemon.stop()
