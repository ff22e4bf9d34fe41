"""Kubernetes Events, sent off the pass: a pass hands each Event to ``EventSink.post`` and goes
on, and one thread sends them in the order they came.

Why: an Event is a round trip to the API server, and a pass that tells of a phase change, a
rollout step or a failover sent up to three of them, each as slow as the API server is busy
(docs/benchmarks.md, scale). client-go's event broadcaster sends off the caller's path too.
An Event is a courtesy: one the API server refuses is logged and dropped, never retried into a
pass, and while ``QUEUE_LIMIT`` wait (an API server that is down) new ones are dropped, counted.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable

from weightcache_operator.objects import Object

log = logging.getLogger("weightcache_operator.act.events")

QUEUE_LIMIT = 1000
"""Events waiting to be sent at most; a few per pass that tells something, so this many wait only
while the API server does not answer."""

Send = Callable[[str, Object], object]
"""Creates one Event in a namespace (``KubeApi.create`` on its events path); raises on failure."""


class EventSink:
    def __init__(self, send: Send, limit: int = QUEUE_LIMIT, counted: Callable[[str], None] | None = None) -> None:
        self._send = send
        self._limit = limit
        self._counted = counted or (lambda outcome: None)
        """Told each Event's outcome: ``sent``, ``failed`` (the API server refused it) or ``dropped``."""
        self._waiting: deque[tuple[str, Object]] = deque()
        self._busy = False
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def post(self, namespace: str, event: Object) -> None:
        """Queues ``event`` for ``namespace``; never blocks, never raises."""
        with self._changed:
            if self._closed or len(self._waiting) >= self._limit:
                log.warning("event dropped: too many waiting", extra={"reason": event.get("reason")})
                self._counted("dropped")
                return
            self._waiting.append((namespace, event))
            self._changed.notify_all()

    def queued(self) -> int:
        """Events waiting to be sent (not the one being sent)."""
        with self._changed:
            return len(self._waiting)

    def flush(self, timeout: float) -> bool:
        """Waits until every Event posted so far has been sent or given up; False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def close(self, timeout: float) -> None:
        """Sends what waits (for up to ``timeout`` s), then stops; later posts are dropped."""
        self.flush(timeout)
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(timeout=1)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or self._closed)
                if not self._waiting:
                    return  # closed and nothing left
                namespace, event = self._waiting.popleft()
                self._busy = True
            try:
                self._send(namespace, event)
                self._counted("sent")
            except Exception as error:  # noqa: BLE001 (any failure: the thread must keep sending the rest)
                log.warning("event not posted", extra={"reason": event.get("reason"), "error": str(error)})
                self._counted("failed")
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
