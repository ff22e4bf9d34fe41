"""What the demo tests share (test_demo_e2e.py, test_vllm_demo_e2e.py): the demo run as a user
runs it, left running with ``--keep`` and torn down with ``down``, and the checks of what it says
about the failover and the client against the operator's record and the client's raw requests."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testcluster.binaries import CLUSTER_SOURCES
from testcluster.demo import NAMESPACE, ClientCount
from testcluster.load import Attempt
from testcluster.local import LocalCluster, running, stop
from testcluster.rest import Kube
from testcluster.sample import events
from testcluster.strays import marked_processes


@dataclass(frozen=True)
class KeptDemo:
    out: str
    """What the demo printed."""
    report: dict[str, Any]
    """Its ``--report``: every client request and what it measured."""
    cluster: LocalCluster
    kube: Kube
    attempts: list[Attempt]


@contextmanager
def kept_demo(tmp_path: Path, *demo_args: str, timeout: float) -> Iterator[KeptDemo]:
    """``python -m testcluster demo <demo_args> --keep --report …`` succeeded and left its cluster
    running; afterwards (the test's checks passed) ``down`` stops it and leaves no process and no
    directory behind."""
    # Short: the daemons' Unix sockets live under the node roots inside it.
    directory = Path(tempfile.mkdtemp(prefix="wc-demo-"))
    report_file = tmp_path / "report.json"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "testcluster", "demo", *demo_args, "--keep"]
            + ["--dir", str(directory), "--report", str(report_file)],
            cwd=CLUSTER_SOURCES,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        out = result.stdout
        print(out)
        assert result.returncode == 0, out[-8000:] + result.stderr[-4000:]
        report = json.loads(report_file.read_text())
        cluster = running(directory)
        assert cluster is not None, "--keep left no cluster running"
        attempts = [Attempt(**a) for a in report["attempts"]]
        yield KeptDemo(out, report, cluster, cluster.kube(), attempts)
    finally:
        session = cluster.session if (cluster := running(directory)) else None
        down = subprocess.run(
            [sys.executable, "-m", "testcluster", "down", "--dir", str(directory)],
            cwd=CLUSTER_SOURCES,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if down.returncode != 0:
            stop(directory)
    assert down.returncode == 0 and "killed leftovers" not in down.stdout, down.stdout + down.stderr
    assert not directory.exists()
    assert session is not None and marked_processes(session) == {}


def check_failover(demo: KeptDemo, status: dict[str, Any], cache: str) -> ClientCount:
    """The failover the demo narrates is the one the operator recorded (status.lastFailover), and
    the only one (one Failover Event); the client's first success after the kill and its counts
    recount from its raw requests. Returns the client's count during the failover."""
    report, out = demo.report, demo.out
    last = status["lastFailover"]
    assert report["killed_pod"] == report["failover_from"] == last["from"], (report["killed_pod"], last)
    assert report["failover_to"] == last["to"] != last["from"]
    assert f"{last['from']} → {last['to']} promoted" in out
    failovers = events(demo.kube, NAMESPACE, "Failover", of=cache)
    assert sum(e.get("count", 1) for e in failovers) == 1, failovers
    assert last["to"] in failovers[0]["message"]
    killed_at = report["killed_at"]
    first_ok = min(a.ended for a in demo.attempts if a.ok and a.started >= killed_at) - killed_at
    assert abs(first_ok - report["client_first_ok_seconds"]) < 0.002
    assert f"first success {report['client_first_ok_seconds']:.2f}s after the kill" in out
    during = ClientCount.of(demo.attempts, *report["failover_window"])
    assert during == ClientCount(**report["failover_client"]) and str(during) in out
    return during


def check_rollout_client(demo: KeptDemo) -> None:
    """The client's count during the rollout recounts from its raw requests: enough requests, none
    failed; and the demo says no weight byte was read and no daemon replaced."""
    during = ClientCount.of(demo.attempts, *demo.report["rollout_window"])
    assert during == ClientCount(**demo.report["rollout_client"]) and str(during) in demo.out
    assert during.sent >= 10 and during.failed == 0, during
    assert "requests failed: 0; weight bytes read from disk: 0; daemon pods replaced or restarted: 0" in demo.out
