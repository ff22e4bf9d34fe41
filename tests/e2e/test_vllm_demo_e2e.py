"""`make demo ENGINE=vllm` as a user runs it (``python -m testcluster demo --engine vllm --keep``, a
detached cluster of its own), and what it prints checked against the cluster it leaves running and
the record of every client request it writes (``--report``): examples/weightcache-vllm-cpu.yaml
became Ready with vLLM engines; the completion through the Service, asked under the model name the
cache serves, has the token ids of vLLM loading the checkpoint from disk; the pod it says it
killed was the active and its standby took over (status.lastFailover, one Failover event), with no
request failed once retried; the engine-args rollout failed no request, read no weight byte from
disk and replaced no daemon, and every engine runs the new arguments; `down` leaves no process."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from testcluster.binaries import CLUSTER_SOURCES
from testcluster.demo import NAMESPACE, VARIANTS, VLLM_ENGINE_ARGS, ClientCount
from testcluster.load import Attempt
from testcluster.local import running, stop
from testcluster.sample import VLLM_MAX_TOKENS, events, pods
from testcluster.strays import marked_processes

pytestmark = pytest.mark.e2e

VLLM = VARIANTS["vllm"]


def test_the_vllm_demo_answers_as_vllm_from_disk_fails_over_and_rolls_out_without_failed_requests(
    tmp_path: Path,
) -> None:
    # Short: the daemons' Unix sockets live under the node roots inside it.
    directory = Path(tempfile.mkdtemp(prefix="wc-vdemo-"))
    report_file = tmp_path / "report.json"
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "testcluster",
                "demo",
                "--engine",
                "vllm",
                "--keep",
                "--dir",
                str(directory),
                "--report",
                str(report_file),
            ],
            cwd=CLUSTER_SOURCES,
            capture_output=True,
            text=True,
            timeout=1500,
        )
        out = result.stdout
        print(out)
        assert result.returncode == 0, out[-8000:] + result.stderr[-4000:]
        report = json.loads(report_file.read_text())
        cluster = running(directory)
        assert cluster is not None, "--keep left no cluster running"
        kube = cluster.kube()
        status = kube.get(VLLM.wc)["status"]

        # Ready, as printed, with vLLM engines (`vllm serve`) mapping the cache.
        assert report["phases"][-1][1] == "Ready" and f"Ready {report['ready_seconds']:.1f}s after the apply" in out
        assert status["phase"] == "Ready" and status["readyNodes"] == "2/2", status
        for engine in pods(kube, NAMESPACE, VLLM.engines):
            command = engine["spec"]["containers"][0]["command"]
            assert command[:2] == ["vllm", "serve"] and "weightcache" in command, command

        # The completion: asked under the name the cache serves, the same greedy tokens as vLLM from disk.
        assert report["served_model"] == status["servedModelName"] == VLLM.name, (report["served_model"], status)
        assert f"the engines serve the model as {VLLM.name!r} (status.servedModelName)" in out
        assert f'"model": "{VLLM.name}"' in out
        ids = report["completion_token_ids"]
        assert len(ids) == VLLM_MAX_TOKENS and ids == report["disk_token_ids"], (ids, report["disk_token_ids"])
        assert f"vLLM from disk (--load-format auto, same checkpoint and arguments): {ids}: the same tokens" in out

        # The failover it narrates is the one the operator recorded, and the only one; the client's
        # numbers recount from its raw requests, and no request failed after its retry.
        last = status["lastFailover"]
        assert report["killed_pod"] == report["failover_from"] == last["from"], (report["killed_pod"], last)
        assert report["failover_to"] == last["to"] != last["from"]
        assert f"{last['from']} → {last['to']} promoted" in out
        failovers = events(kube, NAMESPACE, "Failover", of=VLLM.name)
        assert sum(e.get("count", 1) for e in failovers) == 1, failovers
        attempts = [Attempt(**a) for a in report["attempts"]]
        first_ok = min(a.ended for a in attempts if a.ok and a.started >= report["killed_at"]) - report["killed_at"]
        assert abs(first_ok - report["client_first_ok_seconds"]) < 0.002
        during_failover = ClientCount.of(attempts, *report["failover_window"])
        assert during_failover == ClientCount(**report["failover_client"]) and str(during_failover) in out
        assert during_failover.sent >= 10 and during_failover.failed == 0, during_failover

        # The rollout: no failed request, no weight byte read from disk, no daemon replaced, and
        # every engine on the new template, running the new arguments.
        during_rollout = ClientCount.of(attempts, *report["rollout_window"])
        assert during_rollout == ClientCount(**report["rollout_client"]) and str(during_rollout) in out
        assert during_rollout.sent >= 10 and during_rollout.failed == 0, during_rollout
        assert "requests failed: 0; weight bytes read from disk: 0; daemon pods replaced or restarted: 0" in out
        engines = [p for p in pods(kube, NAMESPACE, VLLM.engines) if not p["metadata"].get("deletionTimestamp")]
        assert len(engines) == 2
        for pod in engines:
            assert " ".join(VLLM_ENGINE_ARGS) in " ".join(pod["spec"]["containers"][0]["command"])
            assert pod["metadata"]["labels"]["weightcache.io/engine-hash"] == report["rollout_revision"]
        assert report["rollout_revision"] != report["rollout_revision_before"]
        assert status["rollout"]["phase"] == "Complete"
        for daemon in pods(kube, NAMESPACE, VLLM.daemons):
            assert all(c["restartCount"] == 0 for c in daemon["status"]["containerStatuses"]), daemon["status"]
        assert f"kubectl get wc {VLLM.name} -o jsonpath" in out
        assert re.search(r"vLLM demo done in \d+m\d\ds .*completion equal to vLLM from disk", out), out[-2000:]
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
