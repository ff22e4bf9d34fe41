"""What the demo tests share (test_demo_e2e.py, test_vllm_demo_e2e.py): the demo run as a user
runs it, left running with ``--keep`` and torn down with ``down``; the check that its terminal output
is its narration only, every component's output in the log files it names; and the checks of what
it says about the failover and the client against the operator's record and the client's raw
requests."""

from __future__ import annotations

import json
import os
import re
import shutil
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
from testcluster.demologs import logs_dir
from testcluster.load import Attempt
from testcluster.local import LocalCluster, pod_log, running, stop
from testcluster.rest import Kube
from testcluster.sample import events, pods
from testcluster.strays import marked_processes

# The shapes of the demo's lines: its intro, step titles, commands ("  $ "), indented detail and
# listings, and the closing lines. Anything else (a log line, a warning, a progress bar) is not it.
NARRATION = re.compile(
    r"|\[\d/7\] .*|  .*"
    r"|weightcache on a local Kubernetes cluster: .*|scheduler, etcd\) and a kubelet that runs pods as local .*"
    r"|The cluster keeps running\. In a shell:|Three things to try:|Stop it with: .*"
    r"|Logs, in .*/ \(the terminal shows only the narration\):|((vLLM|SGLang) )?demo (done|FAILED) in \d+m\d\ds .*"
)
NOT_NARRATION = ["WARNING", "Warning:", "FutureWarning", "it/s]", "Loading safetensors", "Traceback", "INFO "]


def check_narration_only(out: str, err: str) -> None:
    """The demo's terminal output is its narration: nothing on stderr, every stdout line in one of
    the narration's shapes, none from vLLM, torch or Python's warnings."""
    assert err == "", err[-4000:]
    strays = [line for line in out.splitlines() if not NARRATION.fullmatch(line)]
    assert not strays, strays[:20]
    leaked = [line for line in out.splitlines() if any(mark in line for mark in NOT_NARRATION)]
    assert not leaked, leaked[:20]


@dataclass(frozen=True)
class KeptDemo:
    out: str
    """What the demo printed."""
    logs: Path
    """The log directory it named."""
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
    logs = logs_dir(directory)
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
        check_narration_only(out, result.stderr)
        assert f"Logs, in {logs}/ (the terminal shows only the narration):" in out
        for name in ["cluster.log", "gen-checkpoint.log", "demo.log"]:
            assert f"  {name} " in out and (logs / name).exists(), name
        assert "control plane up in" in (logs / "cluster.log").read_text()
        report = json.loads(report_file.read_text())
        cluster = running(directory)
        assert cluster is not None, "--keep left no cluster running"
        assert f"the pods' logs stay in {directory} while the cluster runs" in out
        attempts = [Attempt(**a) for a in report["attempts"]]
        yield KeptDemo(out, logs, report, cluster, cluster.kube(), attempts)
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
        shutil.rmtree(logs, ignore_errors=True)
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


def engine_logs(demo: KeptDemo, engines: str) -> list[str]:
    """The output of the running engines (``engines``: their label selector), read from the files
    the process kubelet writes it to in the kept cluster's directory, which ``kubectl logs`` serves."""
    texts = []
    for pod in pods(demo.kube, NAMESPACE, engines):
        metadata = pod["metadata"]
        served = subprocess.run(
            [demo.cluster.kubectl, "logs", metadata["name"], "-c", "engine"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "KUBECONFIG": demo.cluster.kubeconfig},
        ).stdout
        runs = pod_log(Path(demo.cluster.dir), metadata["namespace"], metadata["name"], metadata["uid"], "engine")
        assert runs, metadata["name"]
        text = runs[-1].read_text()
        # Read after kubectl's: the engine may have written more since.
        assert served and text.startswith(served), (served[-500:], text[-500:])
        texts.append(text)
    return texts
