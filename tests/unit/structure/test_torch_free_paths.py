"""The processes that must start fast never import torch or numpy: the readiness probe (run every
two seconds per daemon pod), the keeper, the status endpoint, and a daemon until it has to load.
Importing torch costs seconds of CPU each time (under load it made probes time out), numpy a
third of a second of a re-adopting daemon's start on an H200 host."""

import subprocess
import sys

import pytest

TORCH_FREE = [
    "weightcache.daemon.probe",
    "weightcache.daemon.keeper",
    "weightcache.daemon.status_endpoint",
    "weightcache.daemon.rank",
    "weightcache.daemon.launcher",
    "weightcache.client.weights",
    "weightcache.cli",
    "weightcache.checkpoints.planner",
    "weightcache.checkpoints.pipeline",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_no_torch(module: str) -> None:
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", f"{module} imported {out.stdout.strip()}"


def test_probe_command_runs_without_torch_or_numpy(lean_env: dict[str, str], tmp_path) -> None:
    """The probe command end to end where ``import torch``/``numpy`` raise: it must report, not crash."""
    out = subprocess.run(
        [sys.executable, "-m", "weightcache", "probe", "--socket-dir", str(tmp_path), "--name", "none", "--ranks", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        env=lean_env,
    )
    assert "lean path" not in out.stderr, out.stderr
    assert out.returncode != 0 and "rank 0" in (out.stdout + out.stderr), out.stdout + out.stderr


def test_plan_command_runs_without_torch_or_numpy(lean_env: dict[str, str], checkpoint_factory) -> None:
    """Planning is headers and arithmetic: a user asks "will it fit" on a machine without torch."""
    ckpt = checkpoint_factory(family="llama")
    out = subprocess.run(
        [sys.executable, "-m", "weightcache", "plan", "--model", str(ckpt), "--tp", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env=lean_env,
    )
    assert out.returncode == 0 and "every rank can be planned" in out.stdout, out.stdout + out.stderr


def test_a_gpu_engine_launcher_checks_for_a_gpu_without_torch(lean_env: dict[str, str], checkpoint_factory) -> None:
    """The launcher of a multi-rank GPU engine only starts ranks: it asks the CUDA driver whether
    there is a GPU instead of importing torch (seconds) before the ranks can even start theirs."""
    ckpt = checkpoint_factory(family="llama")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "weightcache",
            "engine",
            "--model",
            str(ckpt),
            "--tp-size",
            "2",
            "--backend",
            "cuda-vmm",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=lean_env,
    )
    assert "lean path" not in out.stderr, out.stderr
    assert out.returncode != 0 and "sees no CUDA device" in out.stderr, out.stdout + out.stderr
