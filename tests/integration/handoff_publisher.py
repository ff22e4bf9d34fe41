"""A publisher of another load profile, without vLLM: publishes a small torch model into a sealed
arena (``weightcache.engine_profiles.publish``) and execs into the serving daemon (``daemon.handoff``), as
``weightcache daemon --profile vllm`` does after vLLM's loader. ``python handoff_publisher.py
CHECKPOINT SOCKET_DIR NAME``; the fingerprint is the checkpoint's with a test engine stamp."""

from __future__ import annotations

import os
import sys

import torch
from torch import nn
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.daemon.handoff import exec_daemon, handoff_state
from weightcache.engine_profiles.publish import publish
from weightcache.wire.fingerprint import EngineStamp, compute
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import DaemonArgs

STAMP = EngineStamp(engine="test", version="1", load_profile="test", settings={"what": "handoff"})


def fingerprint(checkpoint: str):
    ckpt = open_checkpoint(checkpoint, stamps_only=True)
    base = compute(ckpt, Layout(), resolve("none", None, None), "float32", revision="", backend="cpu-shm")
    return base.model_copy(update={"engine": STAMP})


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 8))


def leak_probe(socket_dir: str) -> str:
    return os.path.join(socket_dir, "inheritable-probe")


def main(checkpoint: str, socket_dir: str, name: str) -> None:
    want = fingerprint(checkpoint)
    files = RankFiles(socket_dir, name, 0)
    files.claim()
    published = publish(model(), want.digest, f"{name}/rank-0")
    assert files.lock_fd is not None
    state = handoff_state(
        published.arena,
        published.manifest,
        want,
        lock_fd=files.lock_fd,
        load_seconds=0.5,
        disk_bytes_read=123,
        adopted=False,
    )
    # A descriptor a library left inheritable (as the CUDA driver and process groups do): the
    # exec must close it.
    os.set_inheritable(os.open(leak_probe(socket_dir), os.O_RDONLY | os.O_CREAT), True)
    exec_daemon(state, DaemonArgs(model=checkpoint, socket_dir=socket_dir, name=name, backend="cpu-shm"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
