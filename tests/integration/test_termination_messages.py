"""What a daemon that cannot go on leaves for Kubernetes and the operator, as real processes: its
error as the termination message (one rank, or the launcher relaying the rank that failed), and,
while it waits, the reason in its status report instead of "no ready file"."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.request
from pathlib import Path

from weightcache_contract.termination import ENV


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_daemon_leaves_its_error_as_the_termination_message(
    llama: Path, start_daemon, tmp_path: Path
) -> None:
    told = tmp_path / "termination-log"
    daemon = start_daemon(llama, pp_size=8, wait=False, env={**os.environ, ENV: str(told)})
    assert daemon.proc.wait(timeout=120) == 2, daemon.output()
    assert told.read_text() == "pipeline size 8 exceeds the model's 4 layers"


def test_the_launcher_relays_the_failed_ranks_error_as_its_own(llama: Path, start_daemon, tmp_path: Path) -> None:
    told = tmp_path / "termination-log"
    daemon = start_daemon(llama, tp_size=3, ranks=[0, 1, 2], wait=False, env={**os.environ, ENV: str(told)})
    assert daemon.proc.wait(timeout=120) == 2, daemon.output()
    # The rank's own words, not "rank N …": every node refusing the spec then says the same.
    message = told.read_text()
    assert message.startswith("num_attention_heads=8 is not divisible by tensor-parallel size 3"), message
    assert "\n" not in message


def test_a_rank_waiting_for_its_gpu_grant_says_why_in_the_status_report(
    llama: Path, start_daemon, tmp_path: Path
) -> None:
    grant = tmp_path / "gpus" / "gpus.json"
    grant.parent.mkdir()
    port = free_port()
    daemon = start_daemon(
        llama, backend="cuda-vmm", ranks=[0], gpus_file=str(grant), status_addr=f"127.0.0.1:{port}", wait=False
    )
    deadline = time.monotonic() + 60
    problem = ""
    while "waiting" not in problem:
        assert daemon.proc.poll() is None and time.monotonic() < deadline, (problem, daemon.output())
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5) as response:
                problem = json.loads(response.read())["ranks"][0]["problem"]
        except OSError:
            time.sleep(0.1)  # not listening yet
    assert problem == (
        f"rank 0: waiting for the GPU holder's grant before touching any GPU: no GPU holder runs "
        f"(nobody holds {grant.with_suffix('.lock')})"
    )
    assert daemon.stop(signal.SIGTERM) == 0, daemon.output()
