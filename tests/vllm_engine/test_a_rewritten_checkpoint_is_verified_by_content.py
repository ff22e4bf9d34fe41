"""A vLLM-profile daemon whose checkpoint is rewritten on disk tells equal bytes from different ones.

The adversarial case: copying a shard over itself (``cp`` to a temporary file, then a rename, as
rsync and re-syncs from object storage do) gives it a new inode and ctime but not one new byte.
The daemon re-hashes the whole file against the digest it took right after vLLM's load, adopts
the new file identity, and a new vLLM engine that refuses any fallback maps the cache again, with
no daemon restart. A shard whose bytes really differ is reported as ``changed``, by name. A daemon
restarted after such a rewrite made while none ran re-adopts the keeper's arena under the new
stamps, verified by the same whole-file digests, instead of loading again."""

import os
import shutil
import signal
import time
from pathlib import Path

from vllm_harness import Engine, assert_zero_copy, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.client.weights import DaemonConnection


def status(daemon, rank: int = 0):
    with DaemonConnection(daemon.files(rank).socket) as conn:
        return conn.status()


def wait_for(condition, daemon, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; status now: {status(daemon).checkpoint}")
        time.sleep(0.2)


def rewrite(shard: Path, change=None) -> None:
    """Copy ``shard`` to a temporary file (optionally changing its bytes) and rename it back: a new inode."""
    tmp = shard.with_name(f".{shard.name}.tmp")
    shutil.copyfile(shard, tmp)
    if change is not None:
        change(tmp)
    tmp.replace(shard)


def flip_last_tensor_bytes(path: Path) -> None:
    """The file's last two bytes (the last tensor's data, past the header), changed in place."""
    with open(path, "r+b") as f:
        f.seek(-2, 2)
        old = f.read(2)
        f.seek(-2, 2)
        f.write(bytes(b ^ 0x01 for b in old))


def test_equal_bytes_under_a_new_inode_are_adopted_and_different_bytes_are_reported(
    tmp_path: Path, socket_dir: str
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    daemon = start_daemon(model, Path(socket_dir), "qwen3", args, logs=tmp_path, checkpoint_poll_seconds=1.0)
    try:
        daemon.wait_ready()
        wait_for(lambda: status(daemon).checkpoint is not None, daemon, "the checkpoint watch")
        before = status(daemon)
        assert before.checkpoint.state == "unchanged", before.checkpoint
        shard = sorted(model.glob("*.safetensors"))[0]

        rewrite(shard)  # equal bytes, new inode and ctime
        wait_for(
            lambda: (
                (s := status(daemon)).fingerprint_digest != before.fingerprint_digest
                and s.checkpoint.state == "unchanged"
            ),
            daemon,
            "the rewritten shard's new stamps adopted",
        )
        assert daemon.proc.poll() is None  # the same daemon, no restart
        ready = daemon.files(0).read_ready()
        assert ready is not None and ready.fingerprint_digest == status(daemon).fingerprint_digest
        log = daemon.log.read_text()
        assert "same bytes under a new file identity" in log, log[-3000:]
        with Engine(model, args, cache=cache_config(daemon), log=tmp_path / "engine.log") as engine:
            assert_zero_copy(engine.report(), tp=1)
            assert engine.generate()

        rewrite(shard, flip_last_tensor_bytes)  # same size and header, other bytes
        wait_for(
            lambda: status(daemon).checkpoint.state == "changed",
            daemon,
            "the change reported",
        )
        watch = status(daemon).checkpoint
        assert watch.changed_files == [shard.name], watch
        assert "its bytes differ" in (watch.detail or ""), watch
    finally:
        if daemon.proc.poll() is None:
            daemon.stop()


def test_a_daemon_restarted_after_an_equal_bytes_rewrite_made_while_it_was_down_readopts_from_the_keeper(
    tmp_path: Path, socket_dir: str, start_keeper
) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    start_keeper()
    first = start_daemon(model, Path(socket_dir), "qwen3", args, logs=tmp_path, checkpoint_poll_seconds=1.0)
    second = None
    try:
        first.wait_ready()
        wait_for(lambda: status(first).deposited, first, "the keeper deposit")
        before = status(first).fingerprint_digest
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait()
        rewrite(sorted(model.glob("*.safetensors"))[0])  # nobody watching: the keeper holds the old stamps

        second = start_daemon(model, Path(socket_dir), "qwen3", args, logs=tmp_path, checkpoint_poll_seconds=1.0)
        second.wait_ready()
        st = status(second)
        log = second.log.read_text()
        assert st.adopted and st.disk_bytes_read == 0 and st.fingerprint_digest != before, log[-3000:]
        assert "re-adopting it under the new ones" in log, log[-3000:]
        with Engine(model, args, cache=cache_config(second), log=tmp_path / "engine.log") as engine:
            assert_zero_copy(engine.report(), tp=1)
            assert engine.generate()
    finally:
        for daemon in (first, second):
            if daemon is not None and daemon.proc.poll() is None:
                daemon.stop()
