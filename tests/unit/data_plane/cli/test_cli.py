"""The ``weightcache`` command table: every command's flags build without torch, every handler
resolves, and the daemon launcher passes each rank the daemon's own flags."""

from __future__ import annotations

import subprocess
import sys

import pytest
from repo_root import ROOT
from weightcache.cli import COMMANDS, build_parser, resolve
from weightcache.daemon.command import rank_args

LAUNCHERS_OWN = {"ranks", "status_addr", "artifact_dir", "artifact_max_bytes", "handoff_state", "dist_init"}
"""What a launcher keeps for itself (a rank never gets them from it)."""
PER_RANK = {"tp_rank", "pp_rank", "device", "local_index"}
"""What the launcher sets for each rank."""


def shared(parsed: object) -> dict[str, object]:
    return {k: v for k, v in vars(parsed).items() if k not in LAUNCHERS_OWN | PER_RANK}


def test_every_command_has_a_callable_handler() -> None:
    assert len({c.name for c in COMMANDS}) == len(COMMANDS)
    for command in COMMANDS:
        assert callable(resolve(command.handler)), command.handler


@pytest.mark.parametrize("command", [[], *([c.name] for c in COMMANDS)], ids=lambda c: " ".join(c) or "weightcache")
def test_help_runs_without_torch_or_numpy(lean_env: dict[str, str], command: list[str]) -> None:
    """Building the parser imports every command's flags: none of them may pull in torch or numpy."""
    out = subprocess.run(
        [sys.executable, "-m", "weightcache", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=lean_env,
    )
    assert out.returncode == 0 and "usage: weightcache" in out.stdout, out.stdout + out.stderr


def test_a_launched_rank_gets_every_daemon_flag_but_the_launchers_own() -> None:
    parser = build_parser()
    launcher = parser.parse_args(
        [
            "daemon",
            "--model",
            "/m",
            "--name",
            "qwen",
            "--socket-dir",
            "/run/wc",
            "--ranks",
            "0-1",
            "--tp-size",
            "2",
            "--ep-size",
            "2",
            "--dtype",
            "bfloat16",
            "--quantization",
            "fp8",
            "--weight-block-size",
            "128x64",
            "--revision",
            "abc",
            "--backend",
            "cuda-vmm",
            "--socket-group",
            "wc",
            "--allow-uid",
            "5",
            "--allow-uid",
            "6",
            "--allow-gid",
            "7",
            "--engine-access",
            "read-write",
            "--keeper",
            "off",
            "--load-workers",
            "2",
            "--status-addr",
            "0.0.0.0:9400",
            "--gpus-file",
            "/g/gpus.json",
            "--synthetic-fill",
            "--device",
            "3",
        ]
    )
    # What daemon.launcher.launch_local_ranks starts the second local rank with.
    second = rank_args(launcher).but(tp_rank=1, pp_rank=0, device=1, local_index=1)
    rank = parser.parse_args(["daemon", *second.to_argv()])
    assert shared(rank) == shared(launcher)
    assert (rank.ranks, rank.status_addr, rank.device, rank.local_index, rank.tp_rank) == (None, None, 1, 1, 1)


def test_rank_flags_leave_out_what_is_unset() -> None:
    args = build_parser().parse_args(["daemon", "--model", "/m", "--name", "x", "--backend", "cpu-shm", "--ranks", "0"])
    argv = rank_args(args).to_argv()
    for absent in (
        "--weight-block-size",
        "--socket-group",
        "--allow-uid",
        "--gpus-file",
        "--synthetic-fill",
        "--ranks",
        "--revision",
    ):
        assert absent not in argv, argv


def test_every_module_the_code_runs_with_python_m_exists() -> None:
    """Processes are started as ``python -m weightcache...``: a moved module must take its callers along."""
    import importlib.util
    import re

    root = ROOT
    named: set[str] = set()
    for folder in ("daemon_image", "benchmarks", "tests"):
        for source in (root / folder).rglob("*.py"):
            named.update(re.findall(r"""["']-m["'],\s*["'](weightcache[\w.]*)["']""", source.read_text()))
    assert "weightcache.tools.bench" in named, named
    missing = sorted(name for name in named if importlib.util.find_spec(name) is None)
    assert not missing, f"python -m targets that do not exist: {missing}"


def test_a_launched_rank_gets_the_launchers_flags_however_the_user_spelled_them() -> None:
    """argparse also takes ``--flag=value`` and unambiguous prefixes (``--tp-s`` for ``--tp-size``):
    the ranks get what the parser made of them, in the flags' full names, never the user's text."""
    parser = build_parser()
    spelled = ["daemon", "--mod=/m", "--name=qwen", "--ranks=0-1", "--tp-s", "2", "--back=cpu-shm", "--allow-u=5"]
    spelled += ["--load-w", "3", "--synthetic"]
    launcher = parser.parse_args(spelled)
    argv = rank_args(launcher).to_argv()

    assert not any(flag in argv for flag in ("--mod=/m", "--tp-s", "--back=cpu-shm", "--load-w", "--synthetic"))
    rank = parser.parse_args(["daemon", *rank_args(launcher).but(tp_rank=1).to_argv()])
    assert (rank.model, rank.name, rank.backend, rank.allow_uid, rank.load_workers, rank.synthetic_fill) == (
        "/m",
        "qwen",
        "cpu-shm",
        [5],
        3,
        True,
    )
    assert shared(rank) == shared(launcher)
