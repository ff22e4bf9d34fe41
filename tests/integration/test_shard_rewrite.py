"""A shard rewritten in place — same size, same header, its mtime put back with ``os.utime`` — is a
different checkpoint: engines do not map the old bytes, a restarted daemon does not re-adopt them,
and a running daemon says so. A shard rewritten with equal bytes (``cp``, rsync) keeps the cache."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, expect, load_from_disk, load_weights
from weightcache.daemon.keeper import KeeperClient, keeper_socket
from weightcache.daemon.probe import probe
from weightcache_contract.daemon_report import CheckpointWatch
from weightcache_contract.errors import FingerprintMismatch


def rewrite_keeping_size_and_mtime(shard: Path) -> None:
    """New tensor bytes in the same file, same size and header, old mtime restored: what size+mtime
    stamps cannot see."""
    st = shard.stat()
    data = bytearray(shard.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = os.urandom(len(data) - header)
    with shard.open("r+b") as fh:  # in place: same inode
        fh.write(data)
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = shard.stat()
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)


@pytest.fixture
def ckpt(llama: Path, tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    shutil.copytree(llama, path)
    return path


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise: random bytes read as bf16 hold NaNs, which never compare equal as numbers."""
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def tensors_from_disk(ckpt: Path) -> dict[str, torch.Tensor]:
    return load_from_disk(expect(str(ckpt), Layout(), dtype="bfloat16")).tensors


def test_an_engine_does_not_map_a_daemon_whose_shard_was_rewritten_with_size_and_mtime_restored(
    ckpt: Path, start_daemon
) -> None:
    daemon = start_daemon(ckpt, dtype="bfloat16")
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    rewrite_keeping_size_and_mtime(shard)
    new = tensors_from_disk(ckpt)

    w = load_weights(
        str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="disk", dtype="bfloat16"
    )
    assert w.mode == "disk" and w.bytes_mapped == 0
    assert "differs in: shards" in w.fallback_reason
    assert all(same_bytes(w.tensors[n], t) for n, t in new.items())  # the rewritten bytes, not the daemon's

    with pytest.raises(FingerprintMismatch) as info:
        load_weights(
            str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
        )
    assert info.value.fields == ["shards"]


def test_a_restarted_daemon_does_not_readopt_an_arena_whose_shard_was_rewritten(
    ckpt: Path, start_keeper, start_daemon
) -> None:
    start_keeper()
    first = start_daemon(ckpt, dtype="bfloat16")
    old_digest = first.files[0].read_ready().fingerprint_digest
    with DaemonConnection(first.files[0].socket) as conn:
        deadline = time.monotonic() + 30
        while not conn.status().deposited:
            assert time.monotonic() < deadline, "the daemon never deposited its arena"
            time.sleep(0.05)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    rewrite_keeping_size_and_mtime(sorted(ckpt.glob("*.safetensors"))[-1])
    new = tensors_from_disk(ckpt)

    second = start_daemon(ckpt, dtype="bfloat16")
    with DaemonConnection(second.files[0].socket) as conn:
        st = conn.status()
    assert not st.adopted and st.disk_bytes_read > 0, second.output()
    assert st.fingerprint_digest != old_digest
    with KeeperClient(keeper_socket(second.socket_dir)) as keeper:
        assert old_digest not in {h.fingerprint_digest for h in keeper.holdings()}  # the stale arena was released
    engine = load_weights(
        str(ckpt), Layout(), socket_dir=second.socket_dir, name=second.name, fallback="error", dtype="bfloat16"
    )
    assert engine.mode == "cache"
    assert all(same_bytes(engine.tensors[n], t) for n, t in new.items())


WATCH = {"dtype": "bfloat16", "checkpoint_poll_seconds": 0.2}


def watch_state(daemon, want: str, timeout: float = 30) -> CheckpointWatch:
    """The rank's checkpoint watch once it reports ``want`` (fails after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        with DaemonConnection(daemon.files[0].socket) as conn:
            watch = conn.status().checkpoint
        if watch is not None and watch.state == want:
            return watch
        assert time.monotonic() < deadline, f"checkpoint watch is {watch}, not {want}:\n{daemon.output()}"
        time.sleep(0.05)


def served_digest(daemon) -> str:
    with DaemonConnection(daemon.files[0].socket) as conn:
        return conn.status().fingerprint_digest


def wait_for_new_digest(daemon, old: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (digest := served_digest(daemon)) == old:
        assert time.monotonic() < deadline, f"the daemon never adopted the new stamps:\n{daemon.output()}"
        time.sleep(0.05)
    return digest


def copy_over(source: Path, shard: Path) -> None:
    """What ``cp source shard`` does: the same inode, truncated and written again."""
    shutil.copyfile(source, shard)


def copy_and_rename(source: Path, shard: Path) -> None:
    """What rsync or a download does: a temporary file renamed over the shard (a new inode)."""
    tmp = shard.with_name(f".{shard.name}.tmp")
    shutil.copyfile(source, tmp)
    os.replace(tmp, shard)


def test_a_running_daemon_reports_a_shard_whose_bytes_changed_in_its_status_log_and_metrics(
    ckpt: Path, start_daemon
) -> None:
    from weightcache.daemon.status_endpoint import collect
    from weightcache_contract.daemon_report import report_metrics

    daemon = start_daemon(ckpt, **WATCH)
    assert watch_state(daemon, "unchanged").changed_files == []
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    rewrite_keeping_size_and_mtime(shard)  # only inode and ctime could tell

    watch = watch_state(daemon, "changed", timeout=15)
    assert watch.changed_files == [shard.name]
    assert "restart the daemon" in (watch.detail or "")
    time.sleep(1)  # several polls more: still one log line for the one change
    lines = [line for line in daemon.output().splitlines() if "checkpoint changed on disk" in line]
    assert len(lines) == 1 and shard.name in lines[0], daemon.output()

    report = collect(daemon.socket_dir, daemon.name, [0], lambda _rank: None, memory=False)
    assert report.ranks[0].checkpoint is not None and report.ranks[0].checkpoint.state == "changed"
    assert report.ranks[0].checkpoint.changed_files == [shard.name]
    assert 'weightcache_daemon_checkpoint_changed{cache="test",gpu="",rank="0"} 1' in report_metrics(report).render()

    cli = subprocess.run(
        [sys.executable, "-m", "weightcache", "status", "--socket-dir", daemon.socket_dir, "--name", daemon.name],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(cli.stdout)["checkpoint"]["changed_files"] == [shard.name]
    assert cli.stderr.startswith("checkpoint changed: ") and "restart the daemon" in cli.stderr


def test_an_engine_refused_after_the_checkpoint_changed_is_told_to_restart_the_daemon_not_to_match_arguments(
    ckpt: Path, start_daemon
) -> None:
    daemon = start_daemon(ckpt, **WATCH)
    rewrite_keeping_size_and_mtime(sorted(ckpt.glob("*.safetensors"))[0])
    with pytest.raises(FingerprintMismatch) as info:
        load_weights(
            str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
        )
    message = str(info.value)
    assert "changed after the daemon loaded it" in message and "restart the daemon" in message
    assert "argument" not in message


@pytest.mark.parametrize("rewrite", [copy_over, copy_and_rename], ids=["cp-over", "cp-and-rename"])
def test_a_shard_rewritten_with_equal_bytes_is_verified_and_a_new_engine_maps_the_cache_without_a_restart(
    ckpt: Path, llama: Path, start_daemon, rewrite
) -> None:
    daemon = start_daemon(ckpt, **WATCH)
    before = served_digest(daemon)
    disk = tensors_from_disk(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    old_stat = shard.stat()
    rewrite(llama / shard.name, shard)
    assert (shard.stat().st_ino, shard.stat().st_ctime_ns) != (old_stat.st_ino, old_stat.st_ctime_ns)

    after = wait_for_new_digest(daemon, before)
    assert watch_state(daemon, "unchanged").changed_files == []
    assert daemon.files[0].read_ready().fingerprint_digest == after
    assert probe(daemon.socket_dir, daemon.name, [0]) == []  # ready file and socket agree again
    log = daemon.output()
    assert "verifying" in log and "same bytes under a new file identity" in log, log

    engine = load_weights(
        str(ckpt), Layout(), socket_dir=daemon.socket_dir, name=daemon.name, fallback="error", dtype="bfloat16"
    )
    assert engine.mode == "cache" and engine.bytes_loaded == 0 and engine.fingerprint.digest == after
    assert all(same_bytes(engine.tensors[n], t) for n, t in disk.items())


def test_a_daemon_restarted_after_an_equal_bytes_rewrite_readopts_its_arena_from_the_keeper(
    ckpt: Path, llama: Path, start_keeper, start_daemon
) -> None:
    start_keeper()
    first = start_daemon(ckpt, **WATCH)
    before = served_digest(first)
    shard = sorted(ckpt.glob("*.safetensors"))[-1]
    copy_and_rename(llama / shard.name, shard)
    after = wait_for_new_digest(first, before)
    deadline = time.monotonic() + 30
    while True:  # the keeper holds the arena under the adopted fingerprint
        with KeeperClient(keeper_socket(first.socket_dir)) as keeper:
            if after in {h.fingerprint_digest for h in keeper.holdings()}:
                break
        assert time.monotonic() < deadline, first.output()
        time.sleep(0.05)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL

    second = start_daemon(ckpt, **WATCH)
    with DaemonConnection(second.files[0].socket) as conn:
        st = conn.status()
    assert st.adopted and st.disk_bytes_read == 0 and st.fingerprint_digest == after, second.output()
    engine = load_weights(
        str(ckpt), Layout(), socket_dir=second.socket_dir, name=second.name, fallback="error", dtype="bfloat16"
    )
    assert engine.mode == "cache" and engine.bytes_loaded == 0


def test_a_daemon_restarted_after_an_equal_bytes_rewrite_made_while_it_was_down_verifies_and_readopts(
    ckpt: Path, llama: Path, start_keeper, start_daemon
) -> None:
    start_keeper()
    first = start_daemon(ckpt, **WATCH)
    before = served_digest(first)
    with DaemonConnection(first.files[0].socket) as conn:
        deadline = time.monotonic() + 30
        while not conn.status().deposited:
            assert time.monotonic() < deadline, "the daemon never deposited its arena"
            time.sleep(0.05)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    copy_and_rename(llama / shard.name, shard)  # nobody watching: the keeper holds the old stamps

    second = start_daemon(ckpt, **WATCH)
    with DaemonConnection(second.files[0].socket) as conn:
        st = conn.status()
    assert st.adopted and st.disk_bytes_read == 0 and st.fingerprint_digest != before, second.output()
    assert "re-adopting it under the new ones" in second.output()
    engine = load_weights(
        str(ckpt), Layout(), socket_dir=second.socket_dir, name=second.name, fallback="error", dtype="bfloat16"
    )
    assert engine.mode == "cache" and engine.bytes_loaded == 0
    assert all(same_bytes(engine.tensors[n], t) for n, t in tensors_from_disk(ckpt).items())


def test_a_running_daemon_reports_a_changed_config_and_a_deleted_shard_by_name(ckpt: Path, start_daemon) -> None:
    daemon = start_daemon(ckpt, **WATCH)
    config = ckpt / "config.json"
    config.write_text(config.read_text().replace("{", '{"_edited": true, ', 1))
    shard = sorted(ckpt.glob("*.safetensors"))[-1]
    shard.unlink()
    deadline = time.monotonic() + 15
    while (watch := watch_state(daemon, "changed")).changed_files != sorted(["config.json", shard.name]):
        assert time.monotonic() < deadline, watch  # each is reported once two looks agree on it
        time.sleep(0.05)
    assert f"{shard.name}: it is missing" in (watch.detail or "")
    assert "config.json: its bytes differ" in (watch.detail or "")


def test_a_running_daemon_reports_a_shard_added_to_the_checkpoints_index(ckpt: Path, start_daemon) -> None:
    daemon = start_daemon(ckpt, **WATCH)
    watch_state(daemon, "unchanged")
    added = ckpt / "model-00004-of-00004.safetensors"
    shutil.copyfile(sorted(ckpt.glob("*.safetensors"))[0], added)
    index = ckpt / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"]["extra.weight"] = added.name
    index.write_text(json.dumps(data))
    watch = watch_state(daemon, "changed", timeout=15)
    assert watch.changed_files == [added.name]
    assert "a shard the checkpoint did not have" in (watch.detail or "")


# The daemon's default poll: after a rewrite its first look (woken by inotify) only sees the stamp
# move, and it judges the file at the next look, a poll later. Those seconds are the window in
# which a new engine used to be told to restart the daemon.
VERIFY_WINDOW = {"dtype": "bfloat16", "checkpoint_poll_seconds": 5.0}


def replace_from_outside(source: Path, shard: Path, staging: Path) -> None:
    """``source``'s bytes renamed over ``shard`` from another directory: a new inode and ctime, and
    one inotify event in the checkpoint's directory (the rename), so the daemon's next look after
    its first is a whole poll later."""
    tmp = staging / f"{shard.name}.new"
    shutil.copyfile(source, tmp)
    os.replace(tmp, shard)


def client_waited(caplog: pytest.LogCaptureFixture) -> bool:
    return any("waiting for its verdict" in r.getMessage() for r in caplog.records if r.name == "weightcache.client")


def test_an_engine_started_while_the_daemon_verifies_an_equal_bytes_rewrite_waits_and_maps_the_cache(
    ckpt: Path, llama: Path, tmp_path: Path, start_daemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = start_daemon(ckpt, **VERIFY_WINDOW)
    watch_state(daemon, "unchanged")
    before = served_digest(daemon)
    disk = tensors_from_disk(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    old = shard.stat()
    replace_from_outside(llama / shard.name, shard, tmp_path)
    assert (shard.stat().st_ino, shard.stat().st_ctime_ns) != (old.st_ino, old.st_ctime_ns)
    assert watch_state(daemon, "verifying", timeout=15).changed_files == [shard.name]

    # An engine that cannot wait is told what the daemon is doing, not to restart it.
    with pytest.raises(FingerprintMismatch) as impatient:
        load_weights(
            str(ckpt),
            Layout(),
            socket_dir=daemon.socket_dir,
            name=daemon.name,
            fallback="error",
            dtype="bfloat16",
            timeout_s=0.5,
        )
    message = str(impatient.value)
    assert "verifying" in message and shard.name in message, message
    assert "restart the daemon" not in message and "changed after the daemon loaded it" not in message, message

    # One that can waits for the verdict and maps the arena under the stamps the daemon adopts.
    with caplog.at_level(logging.INFO, logger="weightcache.client"):
        engine = load_weights(
            str(ckpt),
            Layout(),
            socket_dir=daemon.socket_dir,
            name=daemon.name,
            fallback="error",
            dtype="bfloat16",
            timeout_s=30,
        )
    assert client_waited(caplog), "the engine never saw the daemon verifying: the window closed before it asked"
    assert engine.mode == "cache" and engine.bytes_loaded == 0
    assert engine.fingerprint.digest == served_digest(daemon) != before
    assert watch_state(daemon, "unchanged").changed_files == []
    assert all(same_bytes(engine.tensors[n], t) for n, t in disk.items())


def test_an_engine_started_while_the_daemon_verifies_a_rewrite_with_other_bytes_gets_the_restart_verdict(
    ckpt: Path, tmp_path: Path, start_daemon, caplog: pytest.LogCaptureFixture
) -> None:
    daemon = start_daemon(ckpt, **VERIFY_WINDOW)
    watch_state(daemon, "unchanged")
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    other = tmp_path / "other.safetensors"
    shutil.copyfile(shard, other)
    rewrite_keeping_size_and_mtime(other)  # same size and header: only the re-read can tell
    replace_from_outside(other, shard, tmp_path)
    assert watch_state(daemon, "verifying", timeout=15).changed_files == [shard.name]

    with caplog.at_level(logging.INFO, logger="weightcache.client"), pytest.raises(FingerprintMismatch) as info:
        load_weights(
            str(ckpt),
            Layout(),
            socket_dir=daemon.socket_dir,
            name=daemon.name,
            fallback="error",
            dtype="bfloat16",
            timeout_s=30,
        )
    assert client_waited(caplog), "the engine never saw the daemon verifying: the window closed before it asked"
    message = str(info.value)
    assert "changed after the daemon loaded it" in message and "restart the daemon" in message, message
    assert shard.name in message and "verifying" not in message, message
    assert info.value.fields == ["shards"]
    assert watch_state(daemon, "changed").changed_files == [shard.name]  # the advice is the daemon's verdict
