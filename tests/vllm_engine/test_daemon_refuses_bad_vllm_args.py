"""``--engine-args`` are parsed by vLLM's own parser: a list vLLM refuses, whose parallel layout is not
the daemon's, or that would load other weights than the checkpoint's (every spelling of those:
test_daemon_refuses_vllm_args_that_load_other_weights_however_spelled.py) stops the daemon before it
claims the rank, with the reason and the fix."""

import subprocess
import sys
from pathlib import Path

import pytest
from vllm_harness import ROOT, env, qwen3_checkpoint, vllm_args
from weightcache_contract.launch import VLLM_PROFILE, DaemonArgs


@pytest.mark.parametrize(
    "args, tp, message",
    [
        (vllm_args(tp=2), 1, "tensor parallel 2 and pipeline parallel 1, but the daemon was started with --tp-size 1"),
        ([*vllm_args(), "--no-such-flag"], 1, "vLLM's engine-argument parser refused --engine-args"),
        ([*vllm_args(), "--load_format", "dummy"], 1, "--engine-args make vLLM load with load_format='dummy'"),
    ],
)
def test_vllm_args_vllm_refuses_that_disagree_with_the_daemons_layout_or_load_other_weights_stop_it_before_the_claim(
    tmp_path: Path, args: list[str], tp: int, message: str
) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    done = subprocess.run(
        [sys.executable, "-m", "weightcache", "daemon", *DaemonArgs(
            model=str(model), name="bad", socket_dir=str(tmp_path / "s"), backend="cpu-shm", tp_size=tp,
            profile=VLLM_PROFILE, engine_args=tuple(args),
        ).to_argv()],
        env=env(), cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert message in done.stderr
    assert not (tmp_path / "s" / "bad").exists()  # refused before the rank's files
