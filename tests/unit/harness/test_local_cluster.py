"""The pure parts of `make demo` and the detached local cluster: the demo's client counts, the record
of a cluster whose process is gone, and the progress lines of a cold control-plane build (against
real processes named like the Go compiler). The demo itself runs in tests/e2e/test_demo_e2e.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from testcluster.binaries import _compiling, _report_build
from testcluster.demo import ClientCount
from testcluster.load import Attempt
from testcluster.local import INFO, running, stop
from testcluster.strays import MARKER


def attempt(request: int, started: float, ok: bool, retry: bool = False) -> Attempt:
    return Attempt(started, started + 0.05, ok, retry, None if ok else "ConnectionResetError", request)


def test_a_request_rescued_by_its_retry_counts_as_retried_and_one_failing_twice_as_failed() -> None:
    attempts = [
        attempt(0, 10.0, True),
        attempt(1, 10.2, False),
        attempt(1, 10.6, True, retry=True),
        attempt(2, 10.4, False),
        attempt(2, 10.8, False, retry=True),
        attempt(3, 10.6, True),
    ]
    assert ClientCount.of(attempts, 10.0, 11.0) == ClientCount(sent=4, failed_first=2, retried_ok=1, failed=1)


def test_only_requests_started_inside_the_window_count_and_their_retries_may_end_after_it() -> None:
    attempts = [
        attempt(0, 9.9, False),
        attempt(0, 10.3, True, retry=True),  # started before the window
        attempt(1, 10.9, False),
        attempt(1, 11.3, True, retry=True),  # retried after the window ended
        attempt(2, 11.0, False),
    ]
    assert ClientCount.of(attempts, 10.0, 11.0) == ClientCount(sent=1, failed_first=1, retried_ok=1, failed=0)
    assert (
        str(ClientCount(5, 1, 1, 0))
        == "5 requests sent, 1 failed on the first try, 1 of those succeeded on the retry, 0 failed"
    )


def test_a_recorded_cluster_counts_as_running_only_while_its_marked_process_lives(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir()
    session = "0123abcd"
    holder = subprocess.Popen(["sleep", "30"], env={**os.environ, MARKER: session})
    record = {
        "dir": str(directory),
        "pid": holder.pid,
        "session": session,
        "server": "https://127.0.0.1:1",
        "kubeconfig": "k",
        "kubectl": "/t/kubectl",
        "helm": "/t/helm",
        "nodes": ["node-1"],
    }
    try:
        (directory / INFO).write_text(json.dumps(record))
        # Until ``sleep`` has exec'd, the forked child's environment is still this process's (no
        # marker): wait for the exec, as a recorded cluster process has long exec'd.
        deadline = time.monotonic() + 10
        while (found := running(directory)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert found is not None and found.node_root("node-1") == directory / "kubelet/nodes/node-1/root"
        assert found.shell_setup() == "export KUBECONFIG=k\nexport PATH=/t:$PATH"
        # A live process without the session's marker (a pid recycled after a crash) is not the cluster.
        (directory / INFO).write_text(json.dumps({**record, "pid": os.getpid()}))
        assert running(directory) is None
    finally:
        holder.kill()
        holder.wait()
    (directory / INFO).write_text(json.dumps(record))
    assert running(directory) is None
    assert stop(directory) == {} and not directory.exists()
    assert running(tmp_path / "never-started") is None


def compiler_under_a_build(package: str) -> subprocess.Popen[bytes]:
    """A build (a shell in a session of its own) whose child is a process named like Go's compiler,
    with its ``-p <import path>``."""
    shell = f"bash -c \"exec -a /usr/local/go/pkg/tool/linux_amd64/compile sh -c 'sleep 30' sh -p {package}\"; true"
    return subprocess.Popen(["bash", "-c", shell], start_new_session=True)


def test_build_progress_names_what_the_compiler_works_on_under_that_build_only() -> None:
    build = compiler_under_a_build("k8s.io/apiserver/pkg/server")
    other = compiler_under_a_build("example.com/not/ours")
    try:
        time.sleep(0.5)
        assert _compiling(build.pid) == ["k8s.io/apiserver/pkg/server"]
        lines: list[str] = []
        done = threading.Event()
        reporter = threading.Thread(target=_report_build, args=(build.pid, lines.append, 1.0, done))
        reporter.start()
        time.sleep(2.5)
        done.set()
        reporter.join()
        assert 1 <= len(lines) <= 3, lines
        assert re.fullmatch(
            r"building the control plane: 0m0\ds, 1 packages seen compiling; "
            r"now compiling k8s.io/apiserver/pkg/server",
            lines[0],
        ), lines
    finally:
        for process in (build, other):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
