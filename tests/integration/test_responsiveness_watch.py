"""The operator's own hang detection (responsiveness.py) against real HTTP server processes frozen
with SIGSTOP, the way a deadlocked engine looks from outside: its socket still accepts, nothing
answers. Verdicts are relative: a silent pod is judged only while a peer answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from weightcache_operator.observe.responsiveness import ResponsivenessWatch, answers

KEY = ("ns", "tiny-llama")
TIMEOUT = 0.3


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m http.server`` in its own process: ``/ready`` gets a 404, which is an answer."""

    def __init__(self, tmp: str) -> None:
        port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)],
            cwd=tmp,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}/ready"
        deadline = time.monotonic() + 30
        while not answers(self.url, 1.0):
            assert time.monotonic() < deadline and self.process.poll() is None, "http.server did not start"
            time.sleep(0.05)

    def freeze(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        self.thaw()
        self.process.kill()
        self.process.wait()


@pytest.fixture
def servers(tmp_path) -> Iterator[list[Server]]:  # type: ignore[no-untyped-def]
    started = [Server(str(tmp_path)) for _ in range(2)]
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def watch() -> Iterator[tuple[ResponsivenessWatch, list[object]]]:
    woken: list[object] = []
    lock = threading.Lock()

    def wake(key: object) -> None:
        with lock:
            woken.append(key)

    found = ResponsivenessWatch(wake)
    yield found, woken
    found.forget(KEY)


def wait_until(check, seconds: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def probe_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("responsiveness-") and t.is_alive()]


def test_a_frozen_engine_is_judged_while_its_peer_answers_and_cleared_when_it_answers_again(servers, watch) -> None:  # type: ignore[no-untyped-def]
    found, woken = watch
    a, b = servers
    found.watch(KEY, {"a": a.url, "b": b.url}, TIMEOUT)
    time.sleep(5 * TIMEOUT)
    assert found.unresponsive(KEY) == {} and woken == [], "healthy engines were judged"

    frozen_at = datetime.now(UTC)
    a.freeze()
    wait_until(lambda: "a" in found.unresponsive(KEY), 10, "the frozen engine was never judged")
    silent = found.unresponsive(KEY)
    assert set(silent) == {"a"}
    # The silence began with the first probe left unanswered: sent at most one interval before
    # the freeze (it may have been accepted just before), never after the verdict.
    assert frozen_at - timedelta(seconds=found.interval + 0.05) <= silent["a"] <= datetime.now(UTC)
    wait_until(lambda: woken == [KEY], 5, f"wake was not called once: {woken}")
    time.sleep(3 * TIMEOUT)
    assert woken == [KEY], "one wake per verdict, not one per probe"

    a.thaw()
    wait_until(lambda: found.unresponsive(KEY) == {}, 10, "the thawed engine stayed judged")


def test_no_verdict_without_an_answering_peer(servers, watch) -> None:  # type: ignore[no-untyped-def]
    """Alone, a silent pod is not judged (the watcher cannot tell its own stall from the pod's,
    and there is nobody to hand over to); a peer that answers afterwards makes the verdict."""
    found, woken = watch
    a, b = servers
    found.watch(KEY, {"a": a.url}, TIMEOUT)
    time.sleep(3 * TIMEOUT)
    a.freeze()
    time.sleep(5 * TIMEOUT)
    assert found.unresponsive(KEY) == {} and woken == []
    found.watch(KEY, {"a": a.url, "b": b.url}, TIMEOUT)
    wait_until(lambda: set(found.unresponsive(KEY)) == {"a"}, 10, "the peer's answers did not make the verdict")
    wait_until(lambda: woken == [KEY], 5, f"wake was not called once: {woken}")


def test_pods_dropped_from_the_watch_are_no_longer_probed_or_judged(servers, watch) -> None:  # type: ignore[no-untyped-def]
    found, _ = watch
    a, b = servers
    found.watch(KEY, {"a": a.url, "b": b.url}, TIMEOUT)
    a.freeze()
    wait_until(lambda: "a" in found.unresponsive(KEY), 10, "the frozen engine was never judged")
    found.watch(KEY, {"b": b.url}, TIMEOUT)  # "a" is no longer Ready, say
    assert found.unresponsive(KEY) == {}
    found.forget(KEY)
    # A probe stuck on the frozen server ends with its timeout; none starts again.
    wait_until(lambda: probe_threads() == [], 5, f"probe threads still running: {probe_threads()}")
