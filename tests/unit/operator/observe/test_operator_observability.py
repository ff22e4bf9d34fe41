"""The operator's view of daemon reports (aggregation, the HTTP reader) and its own metrics.

Daemon endpoints here are real HTTP servers on 127.0.0.1 serving real DaemonReport JSON; the
reader under test is the one the operator runs."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from builders import NOW, daemon, make
from daemon_reports import rank, report
from weightcache_contract.daemon_report import CheckpointWatch, DaemonReport
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.prometheus import Metrics
from weightcache_contract.readonly_http import ReadOnlyServer
from weightcache_operator.act.metrics import OperatorMetrics, metrics_server
from weightcache_operator.observe.daemon_status import RECHECK_READY_S, RETRY_FAILED_S, DaemonStatusReader
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import SPEC_HASH_ANNOTATION, daemon_spec_hash
from weightcache_operator.spec import WeightCacheStatus

# --- aggregation ---------------------------------------------------------------------------------


def test_ranks_carry_what_the_daemon_reported_and_the_node_its_fingerprint() -> None:
    cache = make()
    daemon_pod = daemon("tiny-daemon-x", ready=True, spec_hash=daemon_spec_hash(cache))
    held = report(rank(0, gpu_uuid="GPU-a"), rank(1, source="keeper", disk_bytes_read=0))
    status = aggregate(cache, Observed([daemon_pod], [], 1, daemon_reports={"tiny-daemon-x": held}), NOW).wire()
    node = status["nodes"][0]
    assert node["fingerprint"] == held.fingerprint and "reportError" not in node
    assert node["ranks"] == [
        {
            "rank": 0,
            "ready": True,
            "bytes": 4096,
            "loadSeconds": 0.5,
            "gpuUuid": "GPU-a",
            "source": "disk",
            "diskBytesRead": 4000,
        },
        {"rank": 1, "ready": True, "bytes": 8192, "loadSeconds": 1.5, "source": "keeper", "diskBytesRead": 0},
    ]
    WeightCacheStatus.model_validate(status)  # what the CRD schema (generated from it) accepts


def test_a_rank_is_ready_only_if_both_the_pod_and_the_daemon_say_so() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    partly = report(rank(0), rank(1, ready=False))
    status = aggregate(
        cache, Observed([daemon("d", ready=True, annotations=good)], [], 1, daemon_reports={"d": partly}), NOW
    ).wire()
    assert [(r["rank"], r["ready"]) for r in status["nodes"][0]["ranks"]] == [(0, True), (1, False)]
    assert "fingerprint" not in status["nodes"][0], "no node fingerprint until every rank reports one"
    unready = aggregate(
        cache,
        Observed([daemon("d", ready=False, annotations=good)], [], 1, daemon_reports={"d": report(rank(0), rank(1))}),
        NOW,
    ).wire()
    assert [r["ready"] for r in unready["nodes"][0]["ranks"]] == [False, False]
    assert unready["nodes"][0]["ranks"][0]["bytes"] == 4096, "facts stay visible while the pod is not Ready"


def test_an_unreadable_daemon_is_reported_not_raised() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    seen = Observed(
        [daemon("d", ready=True, annotations=good)], [], 1, daemon_reports={"d": "GET http://x/status: refused"}
    )
    node = aggregate(cache, seen, NOW).wire()["nodes"][0]
    assert node["reportError"] == "GET http://x/status: refused"
    assert node["ranks"] == [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}]


# --- the reader, against real HTTP servers -----------------------------------------------------


class DaemonEndpoint:
    """A real HTTP server answering /status with a settable report; counts requests."""

    def __init__(self) -> None:
        self.report: DaemonReport = report(rank(0), rank(1))
        self.requests = 0
        self.server = ReadOnlyServer(("127.0.0.1", 0), {"/status": self._status}, what="test daemon")
        self.server.start()

    def _status(self) -> tuple[str, bytes]:
        self.requests += 1
        return "application/json", self.report.model_dump_json().encode()

    def pod(self, name: str = "d", version: str = "1", uid: str = "u1") -> dict[str, Any]:
        host, port = self.server.address
        return daemon(name, uid=uid, resource_version=version, node=None, ip=host, status_port=port)


@pytest.fixture
def endpoint() -> Iterator[DaemonEndpoint]:
    found = DaemonEndpoint()
    yield found
    found.server.stop()


def test_reader_asks_again_only_when_the_pod_changed(endpoint: DaemonEndpoint) -> None:
    reader = DaemonStatusReader()
    key = ("ns", "tiny")
    assert reader.read(key, [endpoint.pod(version="1")]) == {"d": endpoint.report}
    assert reader.read(key, [endpoint.pod(version="1")]) == {"d": endpoint.report} and endpoint.requests == 1
    endpoint.report = report(rank(0), rank(1, ready=False))
    assert reader.read(key, [endpoint.pod(version="2")]) == {"d": endpoint.report} and endpoint.requests == 2
    assert reader.read(key, [endpoint.pod(version="2", uid="u2")]) == {"d": endpoint.report}, "a new pod of the name"
    assert endpoint.requests == 3
    reader.forget(key)
    reader.read(key, [endpoint.pod(version="2", uid="u2")])
    assert endpoint.requests == 4


def test_reader_asks_a_daemon_that_is_not_ready_again_later(endpoint: DaemonEndpoint) -> None:
    """What a loading or waiting daemon says changes while its pod does not."""
    now = [1000.0]
    reader = DaemonStatusReader(clock=lambda: now[0])
    endpoint.report = report(rank(0, ready=False))
    reader.read(("ns", "tiny"), [endpoint.pod()])
    reader.read(("ns", "tiny"), [endpoint.pod()])
    assert endpoint.requests == 1, "not at once"
    now[0] += RETRY_FAILED_S
    endpoint.report = report(rank(0))
    assert reader.read(("ns", "tiny"), [endpoint.pod()]) == {"d": endpoint.report} and endpoint.requests == 2
    now[0] += RETRY_FAILED_S
    reader.read(("ns", "tiny"), [endpoint.pod()])
    assert endpoint.requests == 2, "a ready report stands longer"


def test_reader_asks_a_ready_daemon_again_after_a_while_and_one_whose_checkpoint_moves_sooner(
    endpoint: DaemonEndpoint,
) -> None:
    """A checkpoint can change under a Ready daemon whose pod never changes: only its report says so."""
    now = [1000.0]
    reader = DaemonStatusReader(clock=lambda: now[0])
    reader.read(("ns", "tiny"), [endpoint.pod()])
    now[0] += RECHECK_READY_S - 1
    reader.read(("ns", "tiny"), [endpoint.pod()])
    assert endpoint.requests == 1
    now[0] += 1
    verifying = rank(0, checkpoint=CheckpointWatch(state="verifying"))
    endpoint.report = report(verifying, rank(1))
    assert reader.read(("ns", "tiny"), [endpoint.pod()]) == {"d": endpoint.report} and endpoint.requests == 2
    now[0] += RETRY_FAILED_S
    reader.read(("ns", "tiny"), [endpoint.pod()])
    assert endpoint.requests == 3, "a checkpoint being verified is asked about again like a loading daemon"


def test_reader_failures_are_messages_and_are_retried_later() -> None:
    now = [1000.0]
    reader = DaemonStatusReader(timeout_s=0.5, clock=lambda: now[0])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens here once the socket closes
    refused = daemon("d", uid="u", resource_version=1, node=None, ip="127.0.0.1", status_port=port)
    first = reader.read(("ns", "tiny"), [refused])["d"]
    assert isinstance(first, str) and first.startswith(f"GET http://127.0.0.1:{port}/status:") and "refused" in first

    # A socket that accepts but never answers: the read gives up after its timeout.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        hung = daemon("h", uid="h", resource_version=1, node=None, ip="127.0.0.1", status_port=silent.getsockname()[1])
        late = reader.read(("ns", "other"), [hung])["h"]
    assert isinstance(late, str) and "timed out" in late

    no_ip = daemon("n", uid="n", resource_version=1, node=None)
    assert reader.read(("ns", "third"), [no_ip]) == {"n": "the pod has no IP yet"}

    # The same failed pod is not asked again at once, but is after RETRY_FAILED_S.
    endpoint = DaemonEndpoint()
    try:
        healed = {**refused, "spec": endpoint.pod()["spec"]}
        assert reader.read(("ns", "tiny"), [healed])["d"] == first, "unchanged pod: the failure is kept for now"
        now[0] += RETRY_FAILED_S
        assert reader.read(("ns", "tiny"), [healed])["d"] == endpoint.report and endpoint.requests == 1
    finally:
        endpoint.server.stop()


def test_reader_refuses_what_is_not_a_daemon_report() -> None:
    server = ReadOnlyServer(("127.0.0.1", 0), {"/status": lambda: ("application/json", b'{"ready": "very"}')}, "junk")
    server.start()
    try:
        host, port = server.address
        pod = daemon("d", uid="u", resource_version=1, node=None, ip=host, status_port=port)
        got = DaemonStatusReader().read(("ns", "tiny"), [pod])["d"]
        assert isinstance(got, str) and "not a daemon report" in got
    finally:
        server.stop()


# --- metrics -----------------------------------------------------------------------------------


def series(text: str) -> dict[str, float]:
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")
    }


def test_operator_metrics_count_passes_and_track_phases_and_engines() -> None:
    m = OperatorMetrics()
    empty = series(m.render())
    assert {k: v for k, v in empty.items() if k.startswith("weightcache_operator_caches")} == {
        f'weightcache_operator_caches{{phase="{p}"}}': 0 for p in ("Pending", "Loading", "Ready", "Degraded", "Failed")
    }
    m.pass_done("ns", "tiny", "ok", 0.02)
    m.pass_done("ns", "tiny", "ok", 3.0)
    m.pass_done("ns", "tiny", "error", 0.5)
    m.cache_status("ns", "tiny", WeightCacheStatus(phase="Ready", active_engines=1, standby_engines=1))
    m.cache_status("ns", "other", WeightCacheStatus(phase="Failed", active_engines=0, standby_engines=0))
    got = series(m.render())
    assert got['weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="ok"}'] == 2
    assert got['weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="error"}'] == 1
    assert (
        got['weightcache_operator_reconcile_seconds_bucket{cache="tiny",namespace="ns",outcome="ok",le="0.025"}'] == 1
    )
    assert got['weightcache_operator_reconcile_seconds_bucket{cache="tiny",namespace="ns",outcome="ok",le="+Inf"}'] == 2
    assert got['weightcache_operator_reconcile_seconds_sum{cache="tiny",namespace="ns",outcome="ok"}'] == 3.02
    assert (
        got['weightcache_operator_caches{phase="Ready"}'] == 1
        and got['weightcache_operator_caches{phase="Failed"}'] == 1
    )
    assert got['weightcache_operator_engines{cache="tiny",namespace="ns",role="standby"}'] == 1

    m.cache_status("ns", "tiny", None)  # deleted: its series go, the phase count drops
    after = series(m.render())
    assert after['weightcache_operator_caches{phase="Ready"}'] == 0
    assert not any('cache="tiny"' in k for k in after if k.startswith("weightcache_operator_engines"))


def test_exposition_escapes_label_values_and_help_and_replaces_gauge_families() -> None:
    m = Metrics()
    m.describe("g", "gauge", "a \\ backslash\nand a newline")
    m.replace("g", [(1, {"path": 'C:\\dir "x"\nnext'}), (2, {"path": "plain"})])
    text = m.render()
    assert "# HELP g a \\\\ backslash\\nand a newline\n" in text
    assert 'g{path="C:\\\\dir \\"x\\"\\nnext"} 1\n' in text and 'g{path="plain"} 2\n' in text
    m.replace("g", [(3, {"path": "plain"})])
    assert series(m.render()) == {'g{path="plain"}': 3}
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_]+="([^"\\]|\\.)*",?)*\})? \S+$')
    assert all(line.startswith("#") or sample.match(line) for line in text.strip().splitlines())


def test_metrics_endpoint_serves_get_metrics_only() -> None:
    m = OperatorMetrics()
    m.pass_done("ns", "tiny", "ok", 0.1)
    server = metrics_server(m, "127.0.0.1:0")
    server.start()
    try:
        host, port = server.address
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert (
                'weightcache_operator_reconcile_total{cache="tiny",namespace="ns",outcome="ok"} 1'
                in response.read().decode()
            )
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://{host}:{port}/status", timeout=10)
        assert missing.value.code == 404 and "GET /metrics" in json.loads(missing.value.read())["error"]
        with pytest.raises(urllib.error.HTTPError) as post:
            urllib.request.urlopen(
                urllib.request.Request(f"http://{host}:{port}/metrics", b"x", method="POST"), timeout=10
            )
        assert post.value.code == 405 and post.value.headers["Allow"] == "GET"
    finally:
        server.stop()


def test_metrics_address_errors_name_the_variable() -> None:
    with pytest.raises(WeightCacheError, match=r"\$WEIGHTCACHE_OPERATOR_METRICS '9090' is not HOST:PORT"):
        metrics_server(OperatorMetrics(), "9090")


def test_the_operator_imports_no_torch() -> None:
    """The operator image has no torch: what it imports from weightcache must not need it."""
    code = "import sys, weightcache_operator.run.handlers; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_reads_of_many_daemons_run_in_parallel_but_never_more_at_once_than_the_bound() -> None:
    """Hundreds of daemons, many passes at once: a fixed number of threads, whatever the fleet."""
    gate = threading.Barrier(4, timeout=5)
    answered = report(rank(0))

    def fetch(url: str, timeout_s: float) -> DaemonReport:
        gate.wait()  # every read waits until 4 are in flight: they must run side by side
        return answered

    counted: list[int] = []
    reader = DaemonStatusReader(fetch=fetch, max_concurrent=4, counted=counted.append)
    pods = [daemon(f"d{i}", uid=f"u{i}", resource_version=1, node=None, ip=f"198.18.0.{i}") for i in range(40)]
    passes = [threading.Thread(target=reader.read, args=((f"ns{k}", "c"), pods[k::4])) for k in range(4)]
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join(timeout=30)
    assert reader.most_concurrent == 4 and sum(counted) == 40
    assert reader.read(("ns0", "c"), pods[0::4]) == {p["metadata"]["name"]: answered for p in pods[0::4]}
    assert sum(counted) == 40, "settled reports are not read again"


def test_a_pass_stopwatch_charges_each_step_the_time_since_the_previous_lap_and_keeps_the_sums() -> None:
    m = OperatorMetrics()
    ticks = iter([10.0, 10.2, 10.3, 13.3, 13.4, 13.45, 13.5])
    watch = m.stopwatch(clock=lambda: next(ticks))
    watch.lap("observe")  # 0.2 s
    watch.lap("gates")  # 0.1 s
    watch.lap("execute")  # 3 s
    watch.lap("gates")  # 0.1 s
    watch.lap("status")  # 0.05 s
    assert watch.elapsed() == pytest.approx(3.5)
    assert watch.steps_ms() == {"observe": 200, "gates": 200, "execute": 3000, "status": 50}, (
        "a step lapped twice adds up"
    )
    got = series(m.render())
    step = "weightcache_operator_pass_step_seconds"
    assert got[f'{step}_sum{{step="observe"}}'] == pytest.approx(0.2)
    assert got[f'{step}_bucket{{step="observe",le="0.25"}}'] == 1
    assert got[f'{step}_bucket{{step="execute",le="2.5"}}'] == 0
    assert got[f'{step}_bucket{{step="execute",le="5"}}'] == 1
    assert got[f'{step}_sum{{step="status"}}'] == pytest.approx(0.05)
    assert got[f'{step}_count{{step="gates"}}'] == 2, "each lap is one observation"
    m.api_request("LIST", 0.3)
    m.api_request("LIST", 0.01)
    assert series(m.render())['weightcache_operator_api_request_seconds_count{verb="LIST"}'] == 2


def test_rollout_gauges_follow_the_latest_rollout_of_each_cache_until_the_cache_is_gone() -> None:
    m = OperatorMetrics()
    progressing = {"phase": "Progressing", "mode": "Engine", "updated": 1, "total": 3, "currentStep": "replica 1"}
    status = {"phase": "Ready", "activeEngines": 3, "standbyEngines": 3, "rollout": progressing}
    assert not any("rollout" in k for k in series(m.render())), "no rollout yet: no series"
    m.cache_status("ns", "tiny", WeightCacheStatus.model_validate(status))
    got = series(m.render())
    phase = 'weightcache_operator_rollout_phase{cache="tiny",mode="Engine",namespace="ns",phase="%s"}'
    assert [got[phase % p] for p in ("Progressing", "Stalled", "Complete")] == [1, 0, 0]
    assert got['weightcache_operator_rollout_updated_replicas{cache="tiny",namespace="ns"}'] == 1
    assert got['weightcache_operator_rollout_replicas{cache="tiny",namespace="ns"}'] == 3

    # A pass that stopped before planning keeps the last one.
    m.cache_status("ns", "tiny", WeightCacheStatus(phase="Failed"))
    assert series(m.render())[phase % "Progressing"] == 1
    completed = {**status, "rollout": {**progressing, "phase": "Complete", "updated": 3}}
    m.cache_status("ns", "tiny", WeightCacheStatus.model_validate(completed))
    got = series(m.render())
    assert [got[phase % p] for p in ("Progressing", "Stalled", "Complete")] == [0, 0, 1]
    assert got['weightcache_operator_rollout_updated_replicas{cache="tiny",namespace="ns"}'] == 3

    m.cache_status("ns", "tiny", None)
    assert not any("rollout" in k for k in series(m.render()))
