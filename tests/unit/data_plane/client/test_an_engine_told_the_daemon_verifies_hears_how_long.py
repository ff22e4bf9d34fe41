"""What an engine that stopped waiting for a daemon's verdict on rewritten checkpoint files says:
what the daemon is doing, how long it takes (from the bytes it re-reads, then from its pace), and
never to restart the daemon; and which differences are worth waiting for at all."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import rewritten_only, verifying_message
from weightcache.wire.fingerprint import Fingerprint, compute
from weightcache_contract.daemon_report import CheckpointWatch

GiB = 2**30


@pytest.fixture
def ckpt(llama: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "ckpt"
    shutil.copytree(llama, copy)
    return copy


def fingerprint(path: Path, dtype: str = "bfloat16") -> Fingerprint:
    ckpt = open_checkpoint(path, stamps_only=True)
    return compute(ckpt, Layout(), resolve("none", None, None), dtype, revision="", backend="cpu-shm")


def message(watch: CheckpointWatch, want: Fingerprint) -> str:
    text = verifying_message("tiny", 0, [want.shards[1].name], want, watch, 10)
    assert "restart" not in text and want.shards[1].name in text and "timeout of 10 s" in text
    return text


def test_a_shard_with_a_new_file_identity_is_worth_waiting_for_and_nothing_else_is(ckpt: Path) -> None:
    held = fingerprint(ckpt)
    shard = sorted(ckpt.glob("*.safetensors"))[1]
    tmp = ckpt.parent / "copy"
    shutil.copyfile(shard, tmp)
    os.replace(tmp, shard)  # same bytes, new inode
    want = fingerprint(ckpt)
    assert rewritten_only(want, held) == [shard.name]
    assert rewritten_only(fingerprint(ckpt, dtype="float32"), held) is None  # an argument: no re-read helps
    grown = want.model_copy(update={"shards": tuple(s.model_copy(update={"size": s.size + 1}) for s in want.shards)})
    assert rewritten_only(grown, held) is None  # another size: the bytes changed, whatever the re-read says


def test_the_message_estimates_from_the_bytes_before_the_read_and_from_the_pace_during_it(ckpt: Path) -> None:
    want = fingerprint(ckpt)
    settling = message(CheckpointWatch(state="verifying", changed_files=[want.shards[1].name]), want)
    assert "stop changing" in settling and "at 1 GB/s" in settling
    before = message(CheckpointWatch(state="verifying", verify_bytes=4 * GiB, verified_bytes=0, verify_seconds=0), want)
    assert "re-reads 4.0 GiB" in before and "about 4 s at 1 GB/s" in before and "start it again in about 4 s" in before
    during = message(
        CheckpointWatch(state="verifying", verify_bytes=4 * GiB, verified_bytes=1 * GiB, verify_seconds=2.0), want
    )
    assert "re-read 1.0 GiB of 4.0 GiB in 2.0 s, about 6 s left" in during and "start it again in about 6 s" in during
    unseen = message(CheckpointWatch(state="unchanged"), want)
    assert "has not looked at them" in unseen
