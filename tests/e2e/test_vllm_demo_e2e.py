"""`make demo ENGINE=vllm` as a user runs it (``python -m testcluster demo --engine vllm --keep``, a
detached cluster of its own), and what it prints checked against the cluster it leaves running and
the record of every client request it writes (``--report``): it prints its narration only, vLLM's
output (warnings, progress bars) in the log files it names; examples/weightcache-vllm-cpu.yaml
became Ready with vLLM engines; the completion through the Service, asked under the model name the
cache serves, has the token ids of vLLM loading the checkpoint from disk; the pod it says it
killed was the active and its standby took over (status.lastFailover, one Failover event), with no
request failed once retried; the engine-args rollout failed no request, read no weight byte from
disk and replaced no daemon, and every engine runs the new arguments; `down` leaves no process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from demo_e2e import check_failover, check_rollout_client, engine_logs, kept_demo
from testcluster.demo import NAMESPACE, VARIANTS, VLLM_ENGINE_ARGS
from testcluster.sample import COMPLETION_TOKENS, pods

pytestmark = pytest.mark.e2e

VLLM = VARIANTS["vllm"]


# Past the demo's own limit (1500 s): pytest's default 600 s would cut a run on a loaded machine short.
@pytest.mark.timeout(1560)
def test_the_vllm_demo_answers_as_vllm_from_disk_fails_over_and_rolls_out_without_failed_requests(
    tmp_path: Path,
) -> None:
    with kept_demo(tmp_path, "--engine", "vllm", timeout=1500) as demo:
        out, report, kube = demo.out, demo.report, demo.kube
        status = kube.get(VLLM.wc)["status"]

        # Ready, as printed, with vLLM engines (`vllm serve`) mapping the cache.
        assert report["phases"][-1][1] == "Ready" and f"Ready {report['ready_seconds']:.1f}s after the apply" in out
        assert status["phase"] == "Ready" and status["readyNodes"] == "2/2", status
        for engine in pods(kube, NAMESPACE, VLLM.engines):
            command = engine["spec"]["containers"][0]["command"]
            assert command[:2] == ["vllm", "serve"] and "weightcache" in command, command

        # vLLM's output went to the log files, not the terminal: vLLM from disk's and the engines'.
        assert "  vllm-from-disk.log " in out
        assert "Loading safetensors checkpoint shards" in (demo.logs / "vllm-from-disk.log").read_text()
        assert all("Starting vLLM server on" in text for text in engine_logs(demo, VLLM.engines))

        # The completion: asked under the name the cache serves, the same greedy tokens as vLLM from disk.
        assert report["served_model"] == status["servedModelName"] == VLLM.name, (report["served_model"], status)
        assert f"the engines serve the model as {VLLM.name!r} (status.servedModelName)" in out
        assert f'"model": "{VLLM.name}"' in out
        ids = report["completion_token_ids"]
        assert len(ids) == COMPLETION_TOKENS and ids == report["disk_token_ids"], (ids, report["disk_token_ids"])
        assert f"vLLM from disk (--load-format auto, same checkpoint and arguments): {ids}: the same tokens" in out

        # The failover it narrates is the one the operator recorded, and no request failed after
        # its retry; the rollout failed none, read no weight byte from disk and replaced no daemon.
        during_failover = check_failover(demo, status, VLLM.name)
        assert during_failover.sent >= 10 and during_failover.failed == 0, during_failover
        check_rollout_client(demo)

        # Every engine on the new template, running the new arguments.
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
