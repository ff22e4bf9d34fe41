"""``weightcache daemon --profile vllm``: what its command line refuses before vLLM is imported,
and what its launcher passes on to each rank. No vLLM here (tests/vllm_engine runs the profile)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from weightcache.cli import build_parser
from weightcache.daemon.command import rank_args
from weightcache.engine_profiles.profile import rendezvous
from weightcache.engine_profiles.publisher import engine_arguments
from weightcache_contract.errors import WeightCacheError

DAEMON = ["daemon", "--model", "/m", "--name", "q", "--socket-dir", "/run/wc", "--backend", "cpu-shm"]


@pytest.fixture
def run_without_vllm(tmp_path: Path) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    """Runs ``weightcache`` in a fresh process in which ``import vllm`` raises: a refusal that
    comes back with its own message was made before vLLM was imported (another test module in the
    same pytest process may already have imported vLLM, so ``sys.modules`` here proves nothing)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise ImportError('vllm imported before the refusal')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "weightcache", *argv], capture_output=True, text=True, timeout=120, env=env
        )

    return run


@pytest.mark.parametrize(
    "text, message",
    [
        (None, "--profile vllm needs --engine-args"),
        ("--dtype bfloat16", "is not JSON"),
        ('{"dtype": "bfloat16"}', "is a JSON list of strings"),
        ('["--max-model-len", 512]', "is a JSON list of strings"),
    ],
)
def test_vllm_args_that_are_not_a_json_list_of_strings_are_refused_by_name(text: str | None, message: str) -> None:
    with pytest.raises(WeightCacheError, match=message):
        engine_arguments(argparse.Namespace(profile="vllm", engine_args=text))


@pytest.mark.parametrize(
    "args",
    [
        ["--dtype", "bfloat16", "--tensor-parallel-size", "2", "--max-model-len", "512"],
        # What these ask vLLM for is decided on vLLM's parse of the list (engine_args), where every
        # spelling of them is seen: tests/vllm_engine/test_daemon_refuses_vllm_args_that_load_other_weights_*.
        ["--load-format", "dummy", "--model=/other", "--model-loader-extra-config", "{}"],
    ],
)
def test_the_vllm_args_list_is_taken_as_given(args: list[str]) -> None:
    assert engine_arguments(argparse.Namespace(profile="vllm", engine_args=json.dumps(args))) == args


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--engine-args", "[]"],
            "--engine-args are an engine's own arguments, which the reference loader does not read",
        ),
        (["--profile", "vllm", "--engine-args", "[]", "--dtype", "bfloat16"], "--dtype bfloat16 is the reference"),
        (["--profile", "vllm", "--engine-args", "[]", "--quantization", "fp8"], "--quantization fp8 is the reference"),
        (["--profile", "vllm", "--engine-args", "[]", "--tp-size", "2"], "start the daemon with --ranks 0-1"),
        (["--profile", "vllm", "--engine-args", "[]", "--ranks", "1", "--tp-size", "2"], "give this pod --ranks 0-1"),
    ],
)
def test_the_daemon_refuses_a_vllm_profile_command_line_it_cannot_serve_before_loading_vllm(
    flags: list[str], message: str, run_without_vllm: Callable[[list[str]], subprocess.CompletedProcess[str]]
) -> None:
    refused = run_without_vllm([*DAEMON, *flags])
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--backend", "cuda-ipc"], "cannot publish cuda-ipc arenas: a legacy CUDA IPC handle names memory of the"),
        (["--backend", "cpu-shm", "--engine-access", "read-write"], "arenas are mapped read-only"),
        (["--backend", "cuda-vmm"], "backend cuda-vmm needs a CUDA GPU (device 0) and 0 are visible"),
    ],
)
def test_a_vllm_profile_daemon_refuses_gpu_arenas_it_cannot_hand_over_or_place_before_loading_vllm(
    flags: list[str], message: str, run_without_vllm: Callable[[list[str]], subprocess.CompletedProcess[str]]
) -> None:
    refused = run_without_vllm([*DAEMON[:-2], *flags, "--profile", "vllm", "--engine-args", "[]"])
    assert refused.returncode == 2 and message in refused.stderr, refused.stderr


def test_each_launched_rank_gets_the_profile_and_the_vllm_args_but_not_the_launchers_rendezvous() -> None:
    vllm_args = '["--dtype","bfloat16","--tensor-parallel-size","2"]'
    args = build_parser().parse_args(
        [*DAEMON, "--profile", "vllm", "--engine-args", vllm_args, "--ranks", "0-1", "--tp-size", "2",
         "--dist-init", "tcp://127.0.0.1:1", "--handoff-state", "/tmp/x"]
    )  # fmt: skip
    argv = rank_args(args).to_argv()
    assert argv[argv.index("--profile") + 1] == "vllm"
    assert json.loads(argv[argv.index("--engine-args") + 1]) == json.loads(vllm_args)
    assert "--dist-init" not in argv and "--handoff-state" not in argv


def test_the_rendezvous_is_a_loopback_port_for_the_whole_world_only() -> None:
    assert rendezvous("vllm", [0, 1], 2, 1).startswith("tcp://127.0.0.1:")
    with pytest.raises(WeightCacheError, match="--ranks 0-3"):
        rendezvous("vllm", [0, 1], 2, 2)
