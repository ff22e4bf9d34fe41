"""``weightcache hf-generate`` on a GPU: transformers fed from a cuda-vmm daemon, and from disk onto the GPU.

Both must complete (the prompt and every generated token go to the weights' device) and produce
transformers' own greedy tokens for the same checkpoint on the same GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from weightcache.tools.reference_hf import greedy, oracle_hf_model, tokenizer_for

pytestmark = pytest.mark.gpu
PROMPT = "The weight cache"


def run_engine(args: list[str]) -> dict[str, Any]:
    """``weightcache hf-generate`` in its own process; its JSON report (the last line it prints)."""
    proc = subprocess.run(
        [sys.executable, "-m", "weightcache", "hf-generate", *args], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, f"hf-generate failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_hf_generate_runs_on_cuda_from_the_cache_and_from_disk(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(family="qwen3")
    daemon = start_daemon(ckpt, backend="cuda-vmm", dtype="bfloat16")
    common = [
        "--model",
        str(ckpt),
        "--backend",
        "cuda-vmm",
        "--dtype",
        "bfloat16",
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "12",
        "--fallback",
        "error",
    ]
    cached = run_engine([*common, "--socket-dir", daemon.socket_dir, "--name", daemon.name])
    disk = run_engine([*common, "--weights", "off"])
    want = greedy(oracle_hf_model(ckpt, "bfloat16").to("cuda"), tokenizer_for(ckpt).encode(PROMPT), 12)
    print(f"\ncache: {cached['tokens']}\ndisk:  {disk['tokens']}\nhf:    {want}")
    assert cached["mode"] == "cache" and cached["device_uuid"].startswith("GPU-") and cached["bytes_loaded"] == 0
    assert disk["mode"] == "disk" and disk["bytes_loaded"] > 0
    assert cached["tokens"] == disk["tokens"] == want
