"""The operator's reader of daemon reports (observe/daemon_status.py): a daemon is asked again only
when its pod changed or its report may have (not ready yet, a checkpoint moving), a failed read is a
message asked again later, and many reads run side by side within a bound.

Daemon endpoints here are real HTTP servers on 127.0.0.1 serving real DaemonReport JSON; the
reader under test is the one the operator runs."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from builders import daemon
from daemon_reports import rank, report
from weightcache_contract.daemon_report import CheckpointWatch, DaemonReport
from weightcache_contract.readonly_http import ReadOnlyServer
from weightcache_operator.observe.daemon_status import RECHECK_READY_S, RETRY_FAILED_S, DaemonStatusReader


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
