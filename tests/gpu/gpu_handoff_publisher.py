"""A ``vllm``-profile publisher on a GPU, without vLLM: what ``weightcache daemon --profile vllm
--backend cuda-vmm`` does after vLLM's loader, with a small torch module in vLLM's place.

``python gpu_handoff_publisher.py CHECKPOINT SOCKET_DIR NAME``: withdraws the rank's arena from the
keeper when it holds this fingerprint, else publishes the module's parameters and buffers from
GPU 0 into a cuda-vmm arena (``weightcache.engine_profiles.publish``); then execs into the serving daemon
(``daemon.handoff``). The fingerprint is the checkpoint's with a test engine stamp.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.daemon.handoff import exec_daemon, handoff_state
from weightcache.daemon.keeper import keeper_socket
from weightcache.daemon.rank import DaemonConfig, adopt_from_keeper
from weightcache.engine_profiles.publish import publish
from weightcache.wire.fingerprint import EngineStamp, compute
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import DaemonArgs

STAMP = EngineStamp(engine="test", version="1", load_profile="test", settings={"what": "gpu-handoff"})
HIDDEN, VOCAB = 64, 256


class Block(nn.Module):
    def __init__(self, cache: torch.Tensor) -> None:
        super().__init__()
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.register_buffer("cos_sin_cache", cache, persistent=False)


class Tiny(nn.Module):
    """Parameters and buffers as a vLLM model has them: a tied lm head, one non-persistent buffer
    shared by two layers, a transposed (dense, non-contiguous) weight, and an attention scale
    that vLLM writes in place (``vllm.loader.WRITTEN_IN_PLACE``)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        cache = torch.arange(HIDDEN, dtype=torch.float32) / HIDDEN
        self.layers = nn.ModuleList([Block(cache), Block(cache)])
        self.wt = nn.Parameter(torch.randn(HIDDEN, HIDDEN).t())
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("_k_scale", torch.tensor(0.5))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = torch.tanh(layer.proj(x) * layer.cos_sin_cache)
        return self.head(x @ self.wt) * self._k_scale


def model(device: str = "cuda:0") -> Tiny:
    """The same weights in every process: made on the CPU from a fixed seed, then moved."""
    torch.manual_seed(0)
    tiny = Tiny().to(device)
    tiny.layers[1].cos_sin_cache = tiny.layers[0].cos_sin_cache  # ``to`` copies each buffer apart
    return tiny


def fingerprint(checkpoint: str):
    ckpt = open_checkpoint(checkpoint, stamps_only=True)
    base = compute(ckpt, Layout(), resolve("none", None, None), "float32", revision="", backend="cuda-vmm", device=0)
    return base.model_copy(update={"engine": STAMP})


def main(checkpoint: str, socket_dir: str, name: str) -> None:
    want = fingerprint(checkpoint)
    files = RankFiles(socket_dir, name, 0)
    files.claim()
    assert files.lock_fd is not None
    cfg = DaemonConfig(model=checkpoint, layout=Layout(), socket_dir=socket_dir, name=name, backend="cuda-vmm")
    adopted = adopt_from_keeper(keeper_socket(socket_dir), cfg, want.digest, {"cache": name, "rank": 0})
    if adopted is not None:
        arena, manifest, seconds = adopted
        state = handoff_state(
            arena, manifest, want, lock_fd=files.lock_fd, load_seconds=seconds, disk_bytes_read=0, adopted=True
        )
    else:
        torch.cuda.set_device(0)
        published = publish(model(), want.digest, f"{name}/rank-0", "cuda-vmm", 0)
        state = handoff_state(
            published.arena,
            published.manifest,
            want,
            lock_fd=files.lock_fd,
            load_seconds=0.5,
            disk_bytes_read=123,
            adopted=False,
        )
    exec_daemon(state, DaemonArgs(model=checkpoint, socket_dir=socket_dir, name=name, backend="cuda-vmm"))


if __name__ == "__main__":
    main(*sys.argv[1:4])
