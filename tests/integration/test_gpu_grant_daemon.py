"""A daemon given a GPU holder's grant file (--gpus-file), as real processes; no GPU needed for
what is tested here: the wait happens before any GPU is touched. tests/gpu/test_gpu_holder.py
runs the holder and two generations' daemons on a real GPU."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from weightcache.gpu.gpu_grant import Grant, take_lock, write_grant

FAKE = "GPU-00000000-1111-2222-3333-444444444444"


def wait_for_text(log: Path, text: str, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


def test_daemon_waits_for_the_grant_says_why_and_stops_cleanly(llama: Path, start_daemon, tmp_path: Path) -> None:
    grant = tmp_path / "gpus" / "gpus.json"
    grant.parent.mkdir()
    daemon = start_daemon(llama, backend="cuda-vmm", ranks=[0], gpus_file=str(grant), wait=False)
    wait_for_text(daemon.log, "waiting for the GPU holder", daemon.proc)
    assert "no GPU holder runs" in daemon.output()
    time.sleep(0.5)
    assert daemon.proc.poll() is None and not daemon.files[0].ready.exists(), "it waits; it never guesses a GPU"
    assert daemon.stop(signal.SIGTERM) == 0, daemon.output()
    assert "stopped while waiting for the GPU holder" in daemon.output()


def test_daemon_refuses_a_granted_gpu_it_cannot_see(llama: Path, start_daemon, tmp_path: Path) -> None:
    grant = tmp_path / "gpus.json"
    fd = take_lock(grant, "t")  # a running holder, as far as the daemon can tell
    try:
        write_grant(grant, Grant(uuids=(FAKE,), token="t", pod="tiny-gpus-abc"))
        daemon = start_daemon(llama, backend="cuda-vmm", ranks=[0], gpus_file=str(grant), wait=False)
        assert daemon.proc.wait(timeout=60) == 2, daemon.output()
    finally:
        os.close(fd)
    assert f"{FAKE}, granted to local rank 0 by {grant}, is not visible to this daemon" in daemon.output()
    assert "NVIDIA_VISIBLE_DEVICES=all" in daemon.output()


def test_gpu_backends_only(llama: Path, start_daemon, tmp_path: Path) -> None:
    daemon = start_daemon(llama, backend="cpu-shm", gpus_file=str(tmp_path / "gpus.json"), wait=False)
    assert daemon.proc.wait(timeout=60) == 2
    assert "backend cpu-shm uses none" in daemon.output()


def _nvml_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_nvml_loads(), reason="NVML is here: tests/gpu/test_gpu_holder.py runs the holder for real")
def test_holder_without_nvml_says_what_the_container_lacks(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "weightcache", "gpu-holder", "--out", str(tmp_path / "gpus.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "reads its GPUs through NVML" in out.stderr and "utility" in out.stderr, out
    assert not (tmp_path / "gpus.json").exists()
