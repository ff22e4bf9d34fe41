"""`make demo`'s cluster path as a user runs it (``python -m testcluster demo --keep``, a detached
cluster of its own), and what it prints checked against the cluster it leaves running and the
record of every client request it writes (``--report``): the phases `kubectl get wc -w` showed end
in Ready; the pod it says it killed was the active and the one it says was promoted took over
(status.lastFailover, one Failover event); the client's numbers recount from the raw requests;
no request failed during the rollout, every engine runs the new template and no daemon was
replaced; the commands it suggests work; `down` leaves no process and no directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from testcluster.binaries import CLUSTER_SOURCES
from testcluster.demo import NAMESPACE, WC, ClientCount
from testcluster.load import Attempt
from testcluster.local import running, stop
from testcluster.sample import DAEMONS, ENGINES, events, pods
from testcluster.strays import marked_processes

pytestmark = pytest.mark.e2e


def test_the_demo_prints_what_happened_and_leaves_a_working_cluster_that_down_removes(tmp_path: Path) -> None:
    # Short: the daemons' Unix sockets live under the node roots inside it.
    directory = Path(tempfile.mkdtemp(prefix="wc-demo-"))
    report_file = tmp_path / "report.json"
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "testcluster",
                "demo",
                "--keep",
                "--dir",
                str(directory),
                "--report",
                str(report_file),
            ],
            cwd=CLUSTER_SOURCES,
            capture_output=True,
            text=True,
            timeout=540,
        )
        out = result.stdout
        assert result.returncode == 0, out[-8000:] + result.stderr[-4000:]
        report = json.loads(report_file.read_text())
        cluster = running(directory)
        assert cluster is not None, "--keep left no cluster running"
        kube = cluster.kube()
        status = kube.get(WC)["status"]

        # The phases as printed (rows of `kubectl get wc -w`) are the ones recorded, ending in Ready,
        # and the cache is still Ready on both nodes.
        rows = re.findall(
            r"^\s+\+\s*([\d.]+)s\s+tiny-llama\s+(Pending|Loading|Ready|Degraded|Failed)\s", out, re.MULTILINE
        )
        printed = [phase for i, (_, phase) in enumerate(rows) if i == 0 or rows[i - 1][1] != phase]
        assert printed == [phase for _, phase in report["phases"]] and printed[-1] == "Ready", (printed, out)
        assert f"Ready {report['ready_seconds']:.1f}s after the apply" in out
        assert status["phase"] == "Ready" and status["readyNodes"] == "2/2", status
        assert report["completion"] and repr(report["completion"]) in out

        # The failover it narrates is the one the operator recorded, and the only one.
        last = status["lastFailover"]
        assert report["killed_pod"] == report["failover_from"] == last["from"], (report["killed_pod"], last)
        assert report["failover_to"] == last["to"] != last["from"]
        assert f"{last['from']} → {last['to']} promoted" in out
        failovers = events(kube, NAMESPACE, "Failover")
        assert sum(e.get("count", 1) for e in failovers) == 1, failovers
        assert last["to"] in failovers[0]["message"]

        # The client's numbers recount from its raw requests.
        attempts = [Attempt(**a) for a in report["attempts"]]
        first_ok = min(a.ended for a in attempts if a.ok and a.started >= report["killed_at"]) - report["killed_at"]
        assert abs(first_ok - report["client_first_ok_seconds"]) < 0.002
        assert f"first success {report['client_first_ok_seconds']:.2f}s after the kill" in out
        during_failover = ClientCount.of(attempts, *report["failover_window"])
        assert during_failover == ClientCount(**report["failover_client"]) and str(during_failover) in out
        during_rollout = ClientCount.of(attempts, *report["rollout_window"])
        assert during_rollout == ClientCount(**report["rollout_client"]) and str(during_rollout) in out
        assert during_rollout.sent >= 10 and during_rollout.failed == 0, during_rollout
        assert "requests failed: 0; weight bytes read from disk: 0; daemon pods replaced or restarted: 0" in out

        # The rollout is what the cluster shows: every engine on the new template and revision, the
        # daemons the ones that were there before it (no restart).
        engines = [p for p in pods(kube, NAMESPACE, ENGINES) if not p["metadata"].get("deletionTimestamp")]
        assert len(engines) == 2
        for pod in engines:
            env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
            assert env.get("DEMO_REVISION") == "2", env
            assert pod["metadata"]["labels"]["weightcache.io/engine-hash"] == report["rollout_revision"]
        assert report["rollout_revision"] != report["rollout_revision_before"]
        assert (
            status["rollout"]["phase"] == "Complete"
            and status["rollout"]["engineTemplateHash"] == report["rollout_revision"]
        )
        for daemon in pods(kube, NAMESPACE, DAEMONS):
            assert all(c["restartCount"] == 0 for c in daemon["status"]["containerStatuses"]), daemon["status"]

        # The shell lines it prints reach the cluster, and a suggested command works as written.
        assert f"export KUBECONFIG={cluster.kubeconfig}" in out and cluster.kubectl in out
        listed = subprocess.run(
            ["kubectl", "get", "wc,pods", "-o", "wide"],
            capture_output=True,
            text=True,
            check=True,
            env={
                **os.environ,
                "KUBECONFIG": cluster.kubeconfig,
                "PATH": f"{Path(cluster.kubectl).parent}:{os.environ['PATH']}",
            },
        )
        assert re.search(r"tiny-llama\s+Ready\s+2/2\s+1\s+1", listed.stdout), listed.stdout
        assert re.search(r"demo done in \d+m\d\ds", out)
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
