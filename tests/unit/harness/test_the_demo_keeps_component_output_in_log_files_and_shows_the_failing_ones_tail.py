"""`make demo`'s terminal shows its narration only (demologs.py): this process's warnings and its
children's stderr go to demo.log; a cluster's logs are copied out of its directory before ``down``
removes it; on a failure the demo names the component (the container that crashed before one that
restarted before one not ready) and shows the last 40 lines of its log. Against real files, real
child processes and pod objects as the API server returns them; the whole demo runs in
tests/e2e/test_demo_e2e.py."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
from testcluster.demo import show_failure
from testcluster.demologs import Suspect, fresh_logs, logs_dir, quiet, suspect, tail
from testcluster.local import copy_logs, kept_log, pod_log


def pod(name: str, namespace: str = "default", component: str = "engine", **container: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "labels": {"weightcache.io/component": component},
        },
        "status": {"containerStatuses": [{"name": component, "ready": True, "restartCount": 0, **container}]},
    }


def write_runs(cluster: Path, item: dict[str, Any], container: str, *texts: str) -> list[Path]:
    metadata = item["metadata"]
    logs = cluster / "kubelet" / "pods" / f"{metadata['namespace']}_{metadata['name']}_{metadata['uid']}" / "logs"
    for run, text in enumerate(texts):
        (logs / container).mkdir(parents=True, exist_ok=True)
        (logs / container / f"{run}.log").write_text(text)
    return pod_log(cluster, metadata["namespace"], metadata["name"], metadata["uid"], container)


def test_warnings_and_a_childs_stderr_go_to_the_log_file_and_not_to_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "demo.log"
    with quiet(log):
        warnings.warn("`resume_download` is deprecated", FutureWarning, stacklevel=1)
        subprocess.run(
            [sys.executable, "-c", "import sys; sys.stderr.write('Loading safetensors 100%|##| 1.2it/s]\\n')"]
        )
        print("  $ narration")
    terminal = capfd.readouterr()
    assert terminal.out == "  $ narration\n" and terminal.err == "", terminal
    text = log.read_text()
    assert "FutureWarning: `resume_download` is deprecated" in text and "Loading safetensors" in text, text
    # Afterwards stderr is the terminal's again.
    print("after", file=sys.stderr)
    assert capfd.readouterr().err == "after\n"


def test_the_log_directory_sits_beside_the_cluster_directory_and_starts_empty(tmp_path: Path) -> None:
    directory = tmp_path / "weightcache-cluster"
    assert logs_dir(directory) == tmp_path / "weightcache-cluster-logs"
    (logs_dir(directory)).mkdir()
    (logs_dir(directory) / "demo.log").write_text("a previous run")
    assert list(fresh_logs(directory).iterdir()) == []


def test_a_clusters_logs_are_copied_where_the_demo_names_them(tmp_path: Path) -> None:
    cluster, target = tmp_path / "cluster", tmp_path / "logs"
    engine = pod("tiny-llama-0-abcde")
    runs = write_runs(cluster, engine, "engine", "first run\n", "listening\n")
    (cluster / "cluster" / "logs").mkdir(parents=True)
    (cluster / "cluster" / "up.log").write_text("control plane up\n")
    (cluster / "cluster" / "logs" / "kube-apiserver.log").write_text("apiserver\n")

    copies = copy_logs(cluster, target)

    assert sorted(p.relative_to(target).as_posix() for p in copies) == [
        "control-plane/logs/kube-apiserver.log",
        "control-plane/up.log",
        "pods/default/tiny-llama-0-abcde/engine/0.log",
        "pods/default/tiny-llama-0-abcde/engine/1.log",
    ]
    assert kept_log(runs[-1], cluster, target).read_text() == "listening\n"


def test_the_crashed_container_is_blamed_before_one_that_restarted_and_one_not_ready(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    crashed = pod(
        "tiny-llama-0-crash",
        restartCount=2,
        ready=False,
        state={"waiting": {"reason": "CrashLoopBackOff"}},
        lastState={"terminated": {"exitCode": 3}},
    )
    restarted = pod(
        "tiny-llama-daemon-x", component="daemon", restartCount=1, lastState={"terminated": {"exitCode": 1}}
    )
    unready = pod("weightcache-operator-y", namespace="weightcache-system", component="", ready=False)
    deleting = pod("tiny-llama-0-old", state={"terminated": {"exitCode": 137}})
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    # The crashed engine's latest run has written nothing yet: the one before says why it stopped.
    runs = write_runs(cluster, crashed, "engine", "run 0\n", "Traceback: the daemon's socket is gone\n", "")

    def logs(item: dict[str, Any], container: str) -> list[Path]:
        metadata = item["metadata"]
        return pod_log(cluster, metadata["namespace"], metadata["name"], metadata["uid"], container)

    blamed = suspect([unready, restarted, deleting, crashed], logs)
    assert blamed == Suspect(
        "engine (container engine of pod default/tiny-llama-0-crash)", "waiting: CrashLoopBackOff, last exit 3", runs[1]
    )
    assert suspect([unready, restarted], logs) == Suspect(
        "daemon (container daemon of pod default/tiny-llama-daemon-x)", "restarted 1 times, last exit 1", None
    )
    operator = suspect([unready], logs)
    assert (
        operator is not None and operator.component.startswith("operator (container ") and operator.why == "not ready"
    )
    assert suspect([pod("tiny-llama-0-fine")], logs) is None


def test_a_failure_names_its_component_and_shows_the_last_40_lines_of_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "pods" / "default" / "tiny-llama-0-crash" / "engine" / "1.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"engine line {i}\n" for i in range(100)))

    show_failure(
        "[3/7] Apply the sample WeightCache and watch it become Ready: tiny-llama not Ready within 300s",
        Suspect("engine (container engine of pod default/tiny-llama-0-crash)", "exited 1", log),
        tmp_path,
    )

    out = capsys.readouterr().out
    assert "FAILED at [3/7] Apply the sample WeightCache and watch it become Ready: tiny-llama not Ready" in out
    assert "failing component: engine (container engine of pod default/tiny-llama-0-crash): exited 1" in out
    assert f"the last 40 lines of {log}:" in out
    shown = [line.removeprefix("    | ") for line in out.splitlines() if line.startswith("    | ")]
    assert shown == tail(log) == [f"engine line {i}" for i in range(60, 100)]
    assert f"(the traceback: {tmp_path / 'demo.log'})" in out
