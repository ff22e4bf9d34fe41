"""`make demo`'s cluster path as a user runs it (``python -m testcluster demo --keep``, a detached
cluster of its own), and what it prints checked against the cluster it leaves running and the
record of every client request it writes (``--report``): it prints its narration only, every
component's output in the log files it names (the engines' where ``kubectl logs`` reads it); the phases `kubectl get wc -w` showed end
in Ready; the pod it says it killed was the active and the one it says was promoted took over
(status.lastFailover, one Failover event); the client's numbers recount from the raw requests;
no request failed during the rollout, every engine runs the new template and no daemon was
replaced; the commands it suggests work; `down` leaves no process and no directory."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from demo_e2e import check_failover, check_rollout_client, engine_logs, kept_demo
from testcluster.demo import NAMESPACE, WC
from testcluster.sample import DAEMONS, ENGINES, NAME, pods

pytestmark = pytest.mark.e2e


def test_the_demo_prints_only_what_happened_and_leaves_a_working_cluster_that_down_removes(tmp_path: Path) -> None:
    with kept_demo(tmp_path, timeout=540) as demo:
        out, report, kube = demo.out, demo.report, demo.kube
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

        # The engines' output is in their log files (kubectl logs serves them), not on the terminal.
        assert all("listening" in text for text in engine_logs(demo, ENGINES))

        check_failover(demo, status, NAME)
        check_rollout_client(demo)

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
        cluster = demo.cluster
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
