"""runner.PassRunner: one pass at a time per cache, triggers during a pass coalesced into one
rerun, none lost. Threads meet at the exact interleaving under test through events and an
instrumented lock; nothing waits on time."""

from __future__ import annotations

import threading
from collections.abc import Callable

from weightcache_operator.run.runner import PassRunner

KEY = ("ns", "cache")
TIMEOUT = 30.0
"""Only a deadlock (a bug) ever waits this long."""


class SteppedLock:
    """A lock that, once armed by a thread, runs a hook on that thread's next release, just
    before the lock is actually released; and that reports a thread blocking on it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.contended = threading.Event()
        self._armed: tuple[int, Callable[[], None]] | None = None

    def arm(self, hook: Callable[[], None]) -> None:
        self._armed = (threading.get_ident(), hook)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(False):
            return True
        if not blocking:
            return False
        self.contended.set()
        return self._lock.acquire(True, timeout)

    def release(self) -> None:
        armed, self._armed = self._armed, None
        if armed is not None and armed[0] == threading.get_ident():
            armed[1]()
        elif armed is not None:
            self._armed = armed
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *_: object) -> None:
        self.release()


def started(target: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_trigger_landing_as_the_pass_gives_up_the_cache_still_gets_its_pass() -> None:
    lock = SteppedLock()
    runner = PassRunner(lock)
    passes: list[bool] = []
    trigger_returned = threading.Event()
    progressed = threading.Event()
    lock.contended.clear()

    def trigger() -> None:
        runner.run(KEY, False, record)
        trigger_returned.set()
        progressed.set()

    def at_release() -> None:
        # The owner has taken its last look for owed passes and is about to give up the cache:
        # a pod event arrives now. Wait until it has either returned or queued on the lock.
        thread = started(trigger)
        threading.Thread(target=lambda: (lock.contended.wait(TIMEOUT), progressed.set()), daemon=True).start()
        assert progressed.wait(TIMEOUT)
        threads.append(thread)

    def record(apply: bool) -> str:
        passes.append(apply)
        if len(passes) == 1:
            lock.arm(at_release)  # the runner's next release of its lock ends this pass
        return f"pass {len(passes)}"

    threads: list[threading.Thread] = []
    assert runner.run(KEY, False, record) == "pass 1"
    for thread in threads:
        thread.join(TIMEOUT)
    assert trigger_returned.is_set()
    assert passes == [False, False], "the trigger that arrived as the pass ended never got its pass"


def test_a_burst_of_triggers_during_a_pass_is_one_rerun() -> None:
    runner = PassRunner()
    passes: list[bool] = []

    def record(apply: bool) -> int:
        passes.append(apply)
        if len(passes) == 1:
            for _ in range(5):  # pod events while the pass runs: each returns at once
                thread = started(lambda: runner.run(KEY, False, record))
                thread.join(TIMEOUT)
                assert not thread.is_alive()
        return len(passes)

    assert runner.run(KEY, False, record) == 2
    assert passes == [False, False]


def test_a_spec_change_during_a_pod_event_pass_runs_its_own_applying_pass_after_it() -> None:
    lock = SteppedLock()
    runner = PassRunner(lock)
    passes: list[bool] = []
    inside = threading.Event()
    registered = threading.Event()
    results: list[object] = []

    def spec_change() -> None:
        lock.arm(registered.set)  # its first release: it has checked in with the runner
        results.append(runner.run(KEY, True, record))

    def record(apply: bool) -> int:
        passes.append(apply)
        if len(passes) == 1:
            inside.set()
            thread = started(spec_change)
            assert registered.wait(TIMEOUT)
            threads.append(thread)
            runner.run(KEY, False, record)  # and a pod event: owed, but the spec change's pass covers it
        return len(passes)

    threads: list[threading.Thread] = []
    assert runner.run(KEY, False, record) == 1
    for thread in threads:
        thread.join(TIMEOUT)
    assert passes == [False, True], "the applying pass was lost or downgraded"
    assert results == [2]


def test_one_pass_at_a_time_per_cache_and_caches_do_not_wait_for_each_other() -> None:
    runner = PassRunner()
    other_ran = threading.Event()
    running: set[str] = set()
    overlaps: list[str] = []

    def first(apply: bool) -> None:
        running.add("a")
        started(lambda: runner.run(("ns", "other"), True, lambda _: other_ran.set())).join(TIMEOUT)
        assert other_ran.is_set(), "a pass of another cache waited for this one"
        running.discard("a")

    def second(apply: bool) -> None:
        if "a" in running:
            overlaps.append("a")

    runner.run(KEY, True, first)
    runner.run(KEY, True, second)
    assert not overlaps


def test_a_failed_pass_releases_the_cache_for_the_next_trigger() -> None:
    runner = PassRunner()

    def failing(apply: bool) -> None:
        raise RuntimeError("API down")

    try:
        runner.run(KEY, True, failing)
    except RuntimeError:
        pass
    assert runner.run(KEY, False, lambda apply: "ran") == "ran"


def test_a_trigger_recorded_during_a_pass_that_fails_still_gets_its_pass() -> None:
    runner = PassRunner()
    passes: list[bool] = []

    def failing_first(apply: bool) -> str:
        passes.append(apply)
        if len(passes) == 1:
            thread = started(lambda: runner.run(KEY, False, failing_first))  # a pod event: returns at once
            thread.join(TIMEOUT)
            assert not thread.is_alive()
            raise RuntimeError("API down")
        return "rerun"

    assert runner.run(KEY, False, failing_first) == "rerun", "the failure a rerun made good was still raised"
    assert passes == [False, False], "the pod event recorded during the failed pass never got its pass"


def test_a_call_whose_last_pass_fails_raises_that_failure_after_the_owed_rerun() -> None:
    runner = PassRunner()
    passes: list[bool] = []

    def always_failing(apply: bool) -> None:
        passes.append(apply)
        if len(passes) == 1:
            started(lambda: runner.run(KEY, False, always_failing)).join(TIMEOUT)
        raise RuntimeError(f"API down ({len(passes)})")

    try:
        runner.run(KEY, True, always_failing)
    except RuntimeError as error:
        assert str(error) == "API down (2)"
    else:
        raise AssertionError("a failing pass returned normally")
    assert passes == [True, True]
    assert runner.run(KEY, False, lambda apply: "ran") == "ran"
