"""`make demo ENGINE=sglang` as a user runs it (``python -m testcluster demo --engine sglang --keep``
from the SGLang test environment, a detached cluster of its own): it prints its narration only,
SGLang's output in the log files it names; examples/weightcache-sglang-cpu.yaml became Ready with
SGLang engines (``sglang serve --load-format weightcache``); the completion through the Service,
asked under the model name the cache serves, has the token ids of SGLang loading the checkpoint
from disk; the pod it says it killed was the active and its standby took over, with no request
failed once retried; the engine-args rollout failed no request, read no weight byte from disk and
replaced no daemon, and every engine runs the new arguments; `down` leaves no process."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from demo_e2e import check_failover, check_rollout_client, engine_logs, kept_demo
from testcluster.demo import NAMESPACE, SGLANG_ENGINE_ARGS, VARIANTS
from testcluster.sample import COMPLETION_TOKENS, pods

pytestmark = pytest.mark.e2e

SGLANG = VARIANTS["sglang"]


# Past the demo's own limit (1500 s): pytest's default 600 s would cut a run on a loaded machine short.
@pytest.mark.timeout(1560)
def test_the_sglang_demo_answers_as_sglang_from_disk_fails_over_and_rolls_out_without_failed_requests(
    tmp_path: Path,
) -> None:
    with kept_demo(tmp_path, "--engine", "sglang", timeout=1500) as demo:
        out, report, kube = demo.out, demo.report, demo.kube
        status = kube.get(SGLANG.wc)["status"]

        # Ready, as printed, with SGLang engines mapping the cache and SGLang-profile daemons.
        assert report["phases"][-1][1] == "Ready" and f"Ready {report['ready_seconds']:.1f}s after the apply" in out
        assert status["phase"] == "Ready" and status["readyNodes"] == "2/2", status
        for engine in pods(kube, NAMESPACE, SGLANG.engines):
            command = engine["spec"]["containers"][0]["command"]
            assert command[:2] == ["sglang", "serve"], command
            assert command[command.index("--load-format") + 1] == "weightcache", command
        for daemon in pods(kube, NAMESPACE, SGLANG.daemons):
            [container] = [c for c in daemon["spec"]["containers"] if c["name"] == "daemon"]
            assert "--profile sglang" in " ".join(container["command"]), container["command"]

        # SGLang's output went to the log files, not the terminal: SGLang from disk's and the engines'.
        assert "  sglang-from-disk.log " in out
        disk_log = (demo.logs / "sglang-from-disk.log").read_text()
        assert "Load weight end." in disk_log and "load_format': 'auto'" in disk_log
        for text in engine_logs(demo, SGLANG.engines):
            assert "The server is fired up and ready to roll!" in text
            # The plug-in's loader mapped the arena (with fallback: disk it would say why it read the disk).
            assert "Mapping and binding weights took" in text and "from disk" not in text, text[-3000:]

        # The completion: asked under the name the cache serves, the same greedy tokens as SGLang from disk.
        assert report["served_model"] == status["servedModelName"] == SGLANG.name, (report["served_model"], status)
        assert f"the engines serve the model as {SGLANG.name!r} (status.servedModelName)" in out
        ids = report["completion_token_ids"]
        assert len(ids) == COMPLETION_TOKENS and ids == report["disk_token_ids"], (ids, report["disk_token_ids"])
        assert f"SGLang from disk (its default loader, same checkpoint and arguments): {ids}: the same tokens" in out

        # The failover it narrates is the one the operator recorded, and no request failed after
        # its retry; the rollout failed none, read no weight byte from disk and replaced no daemon.
        during_failover = check_failover(demo, status, SGLANG.name)
        assert during_failover.sent >= 10 and during_failover.failed == 0, during_failover
        check_rollout_client(demo)

        # Every engine on the new template, running the new arguments.
        engines = [p for p in pods(kube, NAMESPACE, SGLANG.engines) if not p["metadata"].get("deletionTimestamp")]
        assert len(engines) == 2
        for pod in engines:
            assert " ".join(SGLANG_ENGINE_ARGS) in " ".join(pod["spec"]["containers"][0]["command"])
            assert pod["metadata"]["labels"]["weightcache.io/engine-hash"] == report["rollout_revision"]
        assert report["rollout_revision"] != report["rollout_revision_before"]
        assert status["rollout"]["phase"] == "Complete"
        for daemon in pods(kube, NAMESPACE, SGLANG.daemons):
            assert all(c["restartCount"] == 0 for c in daemon["status"]["containerStatuses"]), daemon["status"]
        assert re.search(r"SGLang demo done in \d+m\d\ds .*completion equal to SGLang from disk", out), out[-2000:]
