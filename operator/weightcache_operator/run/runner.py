"""Serialises passes per cache: one pass at a time per key, triggers that arrive during a pass
coalesced into one rerun, no trigger lost.

A trigger that finds a pass running records what it wants (a rerun, and whether that rerun must
apply) and returns; the owner of the running pass reads that record and gives up ownership under
one lock, so a trigger lands either before the owner's last look (and is rerun) or after
ownership was given up (and runs its own pass). Like kopf's per-object worker queue, only
synchronous: passes run in the threads of whoever triggered them.

A trigger that must apply (a spec change, the periodic resync) does not hand its request to
another thread: it waits for the running pass to end and runs its own, so an error in it reaches
its caller (kopf retries the handler). While such a trigger waits, the owner hands the key to it
instead of rerunning: its pass covers what was recorded meanwhile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Protocol, TypeVar

T = TypeVar("T")


class Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...

    def release(self) -> None: ...


@dataclass
class _Key:
    running: bool = False
    pending: bool = False
    """A trigger arrived during the running pass: one more pass is owed."""
    waiting: int = 0
    """Triggers that must apply, waiting for the running pass to end."""


class PassRunner:
    """Runs ``pass_(apply)`` for a key, at most one at a time per key."""

    def __init__(self, lock: Lock | None = None) -> None:
        # Condition takes any object with acquire/release; typeshed names only threading's locks.
        self._changed = threading.Condition(lock or threading.Lock())  # type: ignore[arg-type]
        self._keys: dict[Hashable, _Key] = {}

    def run(self, key: Hashable, apply: bool, pass_: Callable[[bool], T]) -> T | None:
        """One pass for ``key`` with ``apply``, or, while another runs and this trigger need not
        apply, a promise that the running one goes round once more. Returns the result of the
        last pass this call ran, or raises its error; None when it ran none."""
        with self._changed:
            state = self._keys.setdefault(key, _Key())
            if state.running and not apply:
                state.pending = True
                return None
            if state.running:
                state.waiting += 1
                while state.running:
                    self._changed.wait()
                state.waiting -= 1
            state.running = True
        result: T | None = None
        error: Exception | None = None
        try:
            while True:
                with self._changed:
                    state.pending = False
                try:
                    result, error = pass_(apply), None  # a rerun applies when this call's pass did
                except Exception as failed:
                    # A trigger recorded during the failed pass returned at once, trusting this
                    # owner with its pass: it is still owed, so the loop goes round before raising.
                    error = failed
                with self._changed:
                    if not state.pending or state.waiting:
                        # The decision and the release under one lock: no trigger falls between.
                        self._release(key, state)
                        break
        except BaseException:
            with self._changed:
                self._release(key, state)
            raise
        if error is not None:
            raise error  # the call's outcome is its last pass's: an earlier failure a rerun made good is not
        return result

    def _release(self, key: Hashable, state: _Key) -> None:
        state.running = False
        if state.waiting:
            self._changed.notify_all()
        elif self._keys.get(key) is state:
            del self._keys[key]  # nothing owed: forget the key (caches come and go)
