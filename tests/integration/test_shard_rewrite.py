"""A shard rewritten in place — same size, same header, its mtime put back with ``os.utime`` — is a
different checkpoint: engines do not map the old bytes, and a restarted daemon does not re-adopt them."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, expect, load_from_disk, load_weights
from weightcache.daemon.keeper import KeeperClient, keeper_socket
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
    daemon = start_daemon(ckpt, "--dtype", "bfloat16")
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
    first = start_daemon(ckpt, "--dtype", "bfloat16")
    old_digest = first.files[0].read_ready().fingerprint_digest
    with DaemonConnection(first.files[0].socket) as conn:
        deadline = time.monotonic() + 30
        while not conn.status().deposited:
            assert time.monotonic() < deadline, "the daemon never deposited its arena"
            time.sleep(0.05)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    rewrite_keeping_size_and_mtime(sorted(ckpt.glob("*.safetensors"))[-1])
    new = tensors_from_disk(ckpt)

    second = start_daemon(ckpt, "--dtype", "bfloat16")
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
