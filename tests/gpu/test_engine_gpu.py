"""The engine on a GPU: weights mapped from a cuda-vmm daemon, computed where they lie.

Needs the GPU arena backends (cuda-vmm) in the data plane and one CUDA device; TP=2 needs two.
Compares client mode (mapped GPU arena) with off mode (the same shard loaded onto the GPU by the
engine itself) over HTTP, token for token, and checks that the serving model's tensors lie in
the mapped arena.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from engine_process import EngineFactory  # noqa: E402

pytestmark = pytest.mark.gpu
PROMPTS = ["The weight cache", "Once upon a time"]


@pytest.mark.parametrize("tp", [1, 2])
def test_engine_on_gpu_maps_cuda_vmm_weights_and_matches_disk(
    checkpoint_factory, start_daemon, tmp_path, tp: int
) -> None:
    if torch.cuda.device_count() < tp:
        pytest.skip(f"needs {tp} GPUs")
    ckpt = checkpoint_factory(family="qwen3")
    daemon = start_daemon(ckpt, backend="cuda-vmm", tp_size=tp, ranks=list(range(tp)))
    factory = EngineFactory(tmp_path)
    try:
        common = ("--tp-size", str(tp), "--backend", "cuda-vmm", "--weight-cache-fallback", "error")
        cached = factory(
            ckpt, *common, "--weight-cache-mode", "client", "--socket-dir", daemon.socket_dir, "--name", daemon.name
        )
        disk = factory(ckpt, *common, "--weight-cache-mode", "off")
        ranks = cached.get("/health").body["ranks"]
        assert [r["weights"]["mode"] for r in ranks] == ["cache"] * tp
        assert all(r["weights"]["weights_in_arena"] is True for r in ranks)
        for prompt in PROMPTS:
            want = disk.complete(prompt, max_tokens=12)["choices"][0]
            got = cached.complete(prompt, max_tokens=12)["choices"][0]
            assert got["token_ids"] == want["token_ids"] and got["text"] == want["text"]
    finally:
        factory.close()
