"""The daemon pod's status endpoint, against real launcher and rank processes over real HTTP:
the numbers it reports are the ones the ranks loaded, a rank that has not finished is not ready,
a re-adopted rank read nothing from disk, and the endpoint is read-only."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from proc_files import argv, children
from weightcache.checkpoints.checkpoint import open_checkpoint
from weightcache.checkpoints.pipeline import plan_rank, resolve_dtype
from weightcache.checkpoints.quantization import resolve
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import load_weights
from weightcache_contract.daemon_report import DaemonReport, node_fingerprint
from weightcache_contract.errors import FingerprintMismatch
from weightcache_contract.launch import DaemonArgs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, str, str]:
    """(status code, content type, body), errors included."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read().decode()


def report(base: str) -> DaemonReport:
    code, kind, body = get(f"{base}/status")
    assert (code, kind) == (200, "application/json"), body
    return DaemonReport.model_validate_json(body)


def samples(base: str) -> dict[tuple[str, str], float]:
    """``/metrics`` as {(metric name, rank): value}."""
    code, kind, body = get(f"{base}/metrics")
    assert code == 200 and kind.startswith("text/plain; version=0.0.4"), body
    found = {}
    for line in body.splitlines():
        if match := re.fullmatch(r'(\w+)\{cache="test",gpu="",rank="(\d+)"\} (\S+)', line):
            found[(match[1], match[2])] = float(match[3])
    return found


def wait_for_report(base: str, proc: subprocess.Popen, ready: bool, timeout: float = 120) -> DaemonReport:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"launcher exited {proc.returncode}"
        try:
            found = report(base)
            if found.ready == ready:
                return found
        except OSError:
            pass  # not listening yet
        assert time.monotonic() < deadline, f"status never showed ready={ready}"
        time.sleep(0.1)


def planned_read_bytes(model: Path, rank: int, tp: int) -> int:
    """What rank ``rank`` must read from disk, from the safetensors headers alone."""
    checkpoint = open_checkpoint(model)
    plan = plan_rank(checkpoint, Layout(tp, rank), resolve("none", None, None), resolve_dtype("auto", checkpoint))
    return plan.read_bytes


def test_status_and_metrics_report_what_each_rank_loaded(llama: Path, start_daemon) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daemon = start_daemon(llama, tp_size=2, keeper="off", status_addr=f"127.0.0.1:{port}", ranks=[0, 1])
    found = wait_for_report(base, daemon.proc, ready=True)
    assert found.cache == "test" and [r.rank for r in found.ranks] == [0, 1]
    for rank, files in zip(found.ranks, daemon.files):
        info = files.read_ready()
        assert info is not None
        assert rank.ready and rank.problem is None and rank.pid == info.pid != daemon.proc.pid
        assert (rank.backend, rank.gpu_uuid, rank.source) == ("cpu-shm", None, "disk")
        assert rank.bytes == info.arena_bytes and rank.tensor_count == info.tensor_count
        assert rank.load_seconds == info.load_seconds and rank.fingerprint == info.fingerprint.weights_digest
        # Counted by the reads themselves, compared with what the plan says the rank must read.
        assert rank.disk_bytes_read == planned_read_bytes(llama, rank.rank, 2) > 0
        assert rank.maps_served == 0
    assert found.ranks[0].fingerprint != found.ranks[1].fingerprint
    assert found.fingerprint == node_fingerprint(found.ranks) and found.fingerprint is not None
    # cpu-shm arenas live in host memory: the room for a second copy is the host's available RAM.
    assert [m.device for m in found.memory] == ["host"]
    host = found.memory[0]
    assert host.error is None and host.total_bytes and 0 < (host.free_bytes or 0) < host.total_bytes

    # An engine rank maps rank 0's arena: the endpoint counts the map; no byte of it came from disk.
    weights = load_weights(str(llama), Layout(2, 0), socket_dir=daemon.socket_dir, name="test", fallback="error")
    assert weights.mode == "cache"
    metrics = samples(base)
    assert metrics[("weightcache_daemon_maps_served_total", "0")] == 1
    assert metrics[("weightcache_daemon_maps_served_total", "1")] == 0
    for rank in found.ranks:
        r = str(rank.rank)
        assert metrics[("weightcache_daemon_rank_ready", r)] == 1
        assert metrics[("weightcache_daemon_bytes_held", r)] == rank.bytes
        assert metrics[("weightcache_daemon_disk_read_bytes_total", r)] == rank.disk_bytes_read
        assert metrics[("weightcache_daemon_load_seconds", r)] == rank.load_seconds
        assert metrics[("weightcache_daemon_adopted", r)] == 0
    assert daemon.stop() == 0


def test_a_readopted_rank_reports_the_keeper_and_no_disk_read(llama: Path, start_daemon, start_keeper) -> None:
    start_keeper()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = {"status_addr": f"127.0.0.1:{port}"}
    first = start_daemon(llama, **args)
    loaded = wait_for_report(base, first.proc, ready=True).ranks[0]
    assert loaded.source == "disk" and loaded.disk_bytes_read == planned_read_bytes(llama, 0, 1)
    deadline = time.monotonic() + 30
    while not report(base).ranks[0].deposited:  # the keeper holds the arena once deposited
        assert time.monotonic() < deadline, "the rank never deposited its arena with the keeper"
        time.sleep(0.05)
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    os.killpg(first.proc.pid, signal.SIGKILL)  # the launcher's rank too: the pod's container died

    second = start_daemon(llama, **args)
    adopted = wait_for_report(base, second.proc, ready=True).ranks[0]
    assert (adopted.source, adopted.disk_bytes_read) == ("keeper", 0)
    assert adopted.fingerprint == loaded.fingerprint and adopted.bytes == loaded.bytes
    assert samples(base)[("weightcache_daemon_adopted", "0")] == 1


def stop_children_as_they_start(launcher: subprocess.Popen, count: int, timeout: float = 120) -> list[int]:
    """SIGSTOP each rank process the moment the launcher spawns it: it is then still starting,
    long before its load could finish, and stays there until SIGCONT. Only rank processes (a
    ``weightcache daemon`` without the launcher's ``--ranks``) are stopped: the launcher may run
    short helpers of its own (ctypes runs ``ldconfig`` to find libcuda), and stopping one of
    those would hang it."""
    stopped: list[int] = []
    deadline = time.monotonic() + timeout
    while len(stopped) < count:
        assert launcher.poll() is None, f"the launcher exited with {launcher.returncode}"
        assert time.monotonic() < deadline, "the launcher never started its ranks"
        for pid in children(launcher.pid):  # none when the launcher exits meanwhile: the assert above says so
            if pid in stopped:
                continue
            command = argv(pid)
            if command is None or b"daemon" not in command or b"--ranks" in command:
                continue  # not a rank, or a helper that exited while being looked at
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue  # a rank that died at once: the launcher's exit (asserted above) tells why
            stopped.append(pid)
        time.sleep(0.002)
    return stopped


def test_ranks_still_loading_are_not_ready_and_the_endpoint_is_read_only(llama: Path, start_daemon) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daemon = start_daemon(llama, tp_size=2, keeper="off", status_addr=f"127.0.0.1:{port}", ranks=[0, 1], wait=False)
    children = stop_children_as_they_start(daemon.proc, 2)
    try:
        loading = wait_for_report(base, daemon.proc, ready=False)
        assert [(r.rank, r.ready, r.bytes, r.fingerprint) for r in loading.ranks] == [
            (0, False, None, None),
            (1, False, None, None),
        ]
        # What the launcher notes for a rank that has not said anything yet (status_note.py).
        assert [r.problem for r in loading.ranks] == [
            "rank 0: starting",
            "rank 1: starting",
        ] and loading.fingerprint is None
        metrics = samples(base)
        assert (
            metrics[("weightcache_daemon_rank_ready", "0")] == 0
            and ("weightcache_daemon_bytes_held", "0") not in metrics
        )
        # The pod's readiness probe: 503 naming each rank's problem while they load.
        code, kind, body = get(base + "/ready")
        verdict = json.loads(body)
        assert (code, kind, verdict["ready"]) == (503, "application/json", False)
        assert verdict["problems"] == ["rank 0: starting", "rank 1: starting"], verdict

        for path in ("/", "/status/", "/metrics/x", "/../etc/passwd", "/%00", "/" + "a" * 5000):
            code, kind, body = get(base + path)
            assert (code, kind) == (404, "application/json") and "GET /status" in json.loads(body)["error"], path
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            request = urllib.request.Request(f"{base}/status", data=b'{"ready": true}', method=method)
            try:
                urllib.request.urlopen(request, timeout=10)
                raise AssertionError(f"{method} was accepted")
            except urllib.error.HTTPError as error:
                assert error.code == 405 and error.headers["Allow"] == "GET", method
                assert "read-only" in json.loads(error.read())["error"]
        assert report(base).ranks == loading.ranks  # nothing a request sent changed anything
    finally:
        for pid in children:
            os.kill(pid, signal.SIGCONT)
    ready = wait_for_report(base, daemon.proc, ready=True)
    assert [r.pid for r in ready.ranks] == children and all(r.bytes for r in ready.ranks)
    assert get(base + "/ready")[0] == 200 and json.loads(get(base + "/ready")[2]) == {"ready": True, "problems": []}


def test_a_bad_status_addr_is_refused_with_the_fix(llama: Path, socket_dir: str) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "weightcache",
            "daemon",
            *DaemonArgs(model=str(llama), socket_dir=socket_dir, name="test", status_addr="9400").to_argv(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "--status-addr '9400' is not HOST:PORT (e.g. 0.0.0.0:9400" in result.stderr


def test_each_tensor_parallel_rank_reports_a_changed_shard_and_adopts_an_equal_copy_of_another(
    llama: Path, tmp_path: Path, start_daemon
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(llama, ckpt)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    daemon = start_daemon(
        ckpt, tp_size=2, keeper="off", status_addr=f"127.0.0.1:{port}", checkpoint_poll_seconds=0.2, ranks=[0, 1]
    )
    found = wait_for_report(base, daemon.proc, ready=True)
    assert [r.checkpoint.state if r.checkpoint else None for r in found.ranks] == ["unchanged", "unchanged"]
    first, last = sorted(ckpt.glob("*.safetensors"))[0], sorted(ckpt.glob("*.safetensors"))[-1]

    tmp = last.with_name(".copy")  # equal bytes, a new inode: each rank verifies the slices it reads
    shutil.copyfile(llama / last.name, tmp)
    os.replace(tmp, last)
    engine_digests = {}
    deadline = time.monotonic() + 30
    for rank in (0, 1):
        while True:  # an engine rank stamping the files as they are now maps its daemon rank again
            try:
                w = load_weights(
                    str(ckpt), Layout(2, rank), socket_dir=daemon.socket_dir, name="test", fallback="error"
                )
                engine_digests[rank] = w.fingerprint.digest
                break
            except FingerprintMismatch:
                assert time.monotonic() < deadline, report(base)
                time.sleep(0.1)
    assert len(set(engine_digests.values())) == 2

    data = bytearray(first.read_bytes())  # new tensor bytes, same header: every rank reads some of them
    header = 8 + int.from_bytes(data[:8], "little")
    data[header:] = os.urandom(len(data) - header)
    first.write_bytes(data)
    deadline = time.monotonic() + 30
    while True:
        found = report(base)
        if all(r.checkpoint and r.checkpoint.state == "changed" for r in found.ranks):
            break
        assert time.monotonic() < deadline, found
        time.sleep(0.1)
    assert [r.checkpoint.changed_files for r in found.ranks if r.checkpoint] == [[first.name], [first.name]]
    metrics = samples(base)
    assert (
        metrics[("weightcache_daemon_checkpoint_changed", "0")]
        == metrics[("weightcache_daemon_checkpoint_changed", "1")]
        == 1
    )
