"""One pending wake-up per key.

Passes run on watch events; some decisions change with time alone, with no event to announce it
(a readiness gate kept through a daemon outage must turn False when the grace ends, gates.py).
Instead of polling, each pass says when the next such moment is, from everything it saw of the
cache, and that replaces whatever was pending: one timer per cache, none when nothing waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from datetime import datetime

SLACK_SECONDS = 0.05
"""Added to each delay, so a pass woken by the alarm sees the moment as past, not just due."""


class Alarms:
    """Calls ``wake(key)`` on its own thread when a key's alarm is due; at most one per key."""

    def __init__(self, wake: Callable[[Hashable], None]) -> None:
        self._wake = wake
        self._pending: dict[Hashable, tuple[datetime, threading.Timer]] = {}
        self._lock = threading.Lock()

    def set(self, key: Hashable, when: datetime | None, now: datetime) -> None:
        """The one wake-up ``key`` needs now, replacing any pending one: at ``when`` (``now``:
        the caller's clock, the one ``when`` came from), or none."""
        with self._lock:
            pending = self._pending.pop(key, None)
            if pending is not None and pending[0] == when:
                self._pending[key] = pending
                return
            if pending is not None:
                pending[1].cancel()
            if when is None:
                return
            timer = threading.Timer(max(0.0, (when - now).total_seconds()) + SLACK_SECONDS, self._fire, (key, when))
            timer.daemon = True
            self._pending[key] = (when, timer)
            timer.start()

    def cancel(self, key: Hashable) -> None:
        self.set(key, None, datetime.now())

    def forget(self, key: Hashable) -> None:
        """The cache is gone: no wake-up for it (memory.py)."""
        self.cancel(key)

    def pending(self, key: Hashable) -> datetime | None:
        with self._lock:
            found = self._pending.get(key)
        return found[0] if found else None

    def _fire(self, key: Hashable, when: datetime) -> None:
        with self._lock:
            if self._pending.get(key, (None,))[0] != when:
                return  # replaced or cancelled meanwhile
            del self._pending[key]
        self._wake(key)
