"""The operator's long polls of Ready daemon pods (observe/daemon_changes.py): a report that
changes wakes a pass within a second and is read again by that pass, nothing wakes while nothing
changes, a change between the pass's read and the poll's start is not missed, and the polls
follow the pods each pass names, within their cap.

The daemon side is the daemon's real status endpoint (status_endpoint.py) on a real socket, its
ranks replaced by a report the test sets; the reader is the one the operator runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from builders import daemon
from daemon_reports import rank, report
from weightcache.daemon.status_endpoint import status_endpoint
from weightcache_contract.daemon_report import CheckpointWatch, DaemonReport
from weightcache_contract.readonly_http import ReadOnlyServer
from weightcache_operator.observe.daemon_changes import DaemonChanges
from weightcache_operator.observe.daemon_status import DaemonStatusReader

KEY = ("ns", "tiny")


class Daemon:
    def __init__(self) -> None:
        self.report = report(rank(0), rank(1))
        self.server = status_endpoint(("127.0.0.1", 0), lambda memory=True: self.report)
        self.server.start()

    def checkpoint(self, state: str) -> None:
        watch = CheckpointWatch(state=state, changed_files=["model.safetensors"] if state == "changed" else [])  # type: ignore[arg-type]
        self.report = report(rank(0, checkpoint=watch), rank(1, checkpoint=watch))

    def pod(self, name: str = "d", ready: bool = True) -> dict[str, Any]:
        host, port = self.server.address
        return daemon(name, uid=f"uid-{name}", resource_version="1", node=None, ip=host, status_port=port, ready=ready)


class Wakes:
    def __init__(self) -> None:
        self.at: list[float] = []
        self.event = threading.Event()

    def __call__(self, key: tuple[str, str]) -> None:
        assert key == KEY
        self.at.append(time.monotonic())
        self.event.set()


@pytest.fixture
def endpoint() -> Iterator[Daemon]:
    made = Daemon()
    yield made
    made.server.stop()


@pytest.fixture
def world() -> Iterator[tuple[DaemonStatusReader, Wakes, Callable[..., DaemonChanges]]]:
    reader, wakes, made = DaemonStatusReader(), Wakes(), []

    def changes(**kwargs: Any) -> DaemonChanges:
        made.append(DaemonChanges(reader, wakes, **{"wait_s": 5.0, **kwargs}))
        return made[-1]

    yield reader, wakes, changes
    for one in made:
        one.forget(KEY)


def test_a_changed_report_wakes_a_pass_within_a_second_and_that_pass_reads_it(endpoint: Daemon, world) -> None:  # type: ignore[no-untyped-def]
    reader, wakes, changes = world
    watch = changes()
    pod = endpoint.pod()
    reports = reader.read(KEY, [pod])
    watch.watch(KEY, [pod], reports)
    time.sleep(0.5)
    assert wakes.at == []
    changed_at = time.monotonic()
    endpoint.checkpoint("changed")
    assert wakes.event.wait(3), "no wake-up"
    delay = wakes.at[0] - changed_at
    print(f"pass woken {delay:.3f} s after the daemon's report changed")
    assert delay < 1.0
    # The pod did not change and its report was read just now: only the wake-up makes this read ask again.
    seen = reader.read(KEY, [pod])["d"]
    assert isinstance(seen, DaemonReport) and seen.ranks[0].checkpoint is not None
    assert seen.ranks[0].checkpoint.state == "changed"


def test_nothing_wakes_while_nothing_changes(endpoint: Daemon, world) -> None:  # type: ignore[no-untyped-def]
    reader, wakes, changes = world
    watch = changes(wait_s=0.3)
    pod = endpoint.pod()
    watch.watch(KEY, [pod], reader.read(KEY, [pod]))
    time.sleep(1.5)  # several long polls came back with the same digest
    assert wakes.at == []
    assert watch.watched(KEY) == 1


def test_a_change_between_the_read_and_the_polls_start_is_heard(endpoint: Daemon, world) -> None:  # type: ignore[no-untyped-def]
    reader, wakes, changes = world
    pod = endpoint.pod()
    reports = reader.read(KEY, [pod])
    endpoint.checkpoint("verifying")
    changes().watch(KEY, [pod], reports)
    assert wakes.event.wait(2)


def test_the_polls_follow_the_ready_pods_each_pass_names_within_the_cap(endpoint: Daemon, world) -> None:  # type: ignore[no-untyped-def]
    reader, _wakes, changes = world
    watch = changes(max_watched=2)
    a, b, c, loading = endpoint.pod("a"), endpoint.pod("b"), endpoint.pod("c"), endpoint.pod("l", ready=False)
    watch.watch(KEY, [a, b, c, loading], reader.read(KEY, [a, b, c, loading]))
    assert watch.watched(KEY) == 2, "two at most; the third is left to the re-reads"
    watch.watch(KEY, [a], reader.read(KEY, [a]))
    assert watch.watched(KEY) == 1
    watch.forget(KEY)
    assert watch.watched(KEY) == 0


class OldDaemon:
    """A daemon from before the long poll: /status ignores the query and sends no ETag."""

    def __init__(self) -> None:
        self.requests = 0
        self.server = ReadOnlyServer(("127.0.0.1", 0), {"/status": self._status}, what="old daemon")
        self.server.start()

    def _status(self) -> tuple[str, bytes]:
        self.requests += 1
        return "application/json", report(rank(0)).model_dump_json().encode()


def test_a_daemon_without_the_long_poll_is_left_to_the_rereads_without_spinning(world) -> None:  # type: ignore[no-untyped-def]
    reader, wakes, changes = world
    old = OldDaemon()
    try:
        host, port = old.server.address
        pod = daemon("old", uid="uid-old", node=None, ip=host, status_port=port, ready=True)
        watch = changes()
        watch.watch(KEY, [pod], reader.read(KEY, [pod]))
        time.sleep(1.0)
        assert old.requests == 2, "the pass's read and one poll that found no ETag"
        assert wakes.at == []
    finally:
        old.server.stop()


def test_a_change_heard_while_a_read_is_out_is_kept_for_the_next_read(endpoint: Daemon) -> None:
    started, release = threading.Event(), threading.Event()
    reader: DaemonStatusReader

    def slow_fetch(url: str, timeout: float) -> DaemonReport:
        started.set()
        release.wait(5)
        return report(rank(0))

    reader = DaemonStatusReader(fetch=slow_fetch)
    pod = endpoint.pod()
    out = threading.Thread(target=reader.read, args=(KEY, [pod]))
    out.start()
    assert started.wait(5)
    reader.invalidate(KEY, "uid-d")  # heard while that read was out: what it brings back may be older
    release.set()
    out.join(5)
    started.clear()
    reader.read(KEY, [pod])
    assert started.is_set(), "the next read asked the daemon again"
