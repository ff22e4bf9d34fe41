"""A pass's independent requests (together.py: snapshot.observe's reads, the gate patches) are
sent at once: the pass waits for the slowest, not the sum."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from weightcache_operator.together import THREADS, all_at_once


def test_reads_given_an_executor_are_all_in_flight_together() -> None:
    # Five calls that each wait until all five have started: one after another, the first one's
    # barrier would time out.
    started = threading.Barrier(5, timeout=10)

    def read(value: int) -> int:
        started.wait()
        return value

    with ThreadPoolExecutor(max_workers=THREADS) as reads:
        got = all_at_once(reads, **{f"r{i}": (lambda i=i: read(i)) for i in range(5)})
    assert got == {f"r{i}": i for i in range(5)}


def test_a_failed_read_raises_only_once_every_read_has_ended() -> None:
    ended: list[str] = []
    release = threading.Event()

    def slow() -> str:
        release.wait(10)
        ended.append("slow")
        return "late"

    def failing() -> str:
        release.set()
        raise LookupError("the pods could not be listed")

    with ThreadPoolExecutor(max_workers=4) as reads, pytest.raises(LookupError, match="pods could not"):
        all_at_once(reads, slow=slow, failing=failing)
    assert ended == ["slow"]  # no read is left running behind a pass that gave up


def test_without_an_executor_the_reads_run_in_order_on_the_callers_thread() -> None:
    seen: list[tuple[str, str]] = []

    def read(name: str) -> str:
        seen.append((name, threading.current_thread().name))
        return name

    assert all_at_once(None, a=lambda: read("a"), b=lambda: read("b")) == {"a": "a", "b": "b"}
    assert seen == [("a", threading.current_thread().name), ("b", threading.current_thread().name)]
