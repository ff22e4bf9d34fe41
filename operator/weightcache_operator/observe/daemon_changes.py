"""Hearing a daemon's report change within about a second: one long poll per Ready daemon pod.

The daemons hold no Kubernetes API rights, so nothing they see (a checkpoint re-synced under a
Ready daemon: ``verifying``, then ``changed``) reaches the operator by a watch event. Instead, each
pass names the cache's Ready daemon pods (``watch``), and for each one a thread holds a long poll
of its status endpoint, ``GET /status?wait=WAIT_S&after=<digest>`` (the daemon's
status_endpoint.py): the daemon answers as soon as its report's digest (``report_digest``)
differs from the one this side last saw. Then the reader's memory of that pod is marked stale
(daemon_status.py ``invalidate``) and ``wake`` runs a pass for the cache: through the same runner
as every other trigger, so one plan per pass holds and a burst of changes on many nodes is one
or two passes. The first poll of a pod asks ``after`` the digest of the report the pass just
read, so a change between that read and the poll's start is not missed.

Cost and bounds: a thread and a socket per watched pod, blocked in ``recv`` almost all the time
(a Python thread's stack is reserved, not touched: a few tens of KiB resident each), and one HTTP
request per pod per ``WAIT_S`` while nothing changes. At most ``MAX_WATCHED`` pods are watched
over all caches; pods beyond it, and pods whose daemon predates the long poll (no ``ETag``) or
keeps failing, are left to the reader's re-reads (``RECHECK_READY_S``, ``RETRY_FAILED_S``), which
stay the safety net for every pod. Wake-ups are coalesced per cache: at most one waking thread
per cache at a time.
"""

from __future__ import annotations

import logging
import threading
import urllib.error
from collections.abc import Callable, Mapping
from typing import Any

from weightcache_contract.daemon_report import DaemonReport, report_digest

from weightcache_operator.objects import PodView
from weightcache_operator.observe.daemon_status import (
    DIRECT,
    FETCH_TIMEOUT_S,
    DaemonStatusReader,
    Fetched,
    status_url,
)
from weightcache_operator.vocabulary import CacheKey

log = logging.getLogger("weightcache_operator.observe.daemon_changes")

WAIT_S = 20.0
"""How long the daemon holds each long poll: a request per pod per this while nothing changes."""
BACKOFF_S = 2.0
"""After a failed poll (refused, timed out, the daemon's waiter cap reached), before the next."""
MIN_INTERVAL_S = 0.2
"""Between two polls of one pod: a daemon that answers at once every time cannot spin a thread."""
MAX_WATCHED = 1000
"""Pods watched at once over all caches; the rest are re-read as before (``RECHECK_READY_S``)."""

LongPoll = Callable[[str, str, float], str | None]
"""(status URL, ``after``, wait seconds) → the ETag the daemon answered, None when it sent none
(a daemon that predates the long poll); raises OSError when the request failed."""


def http_long_poll(url: str, after: str, wait_s: float) -> str | None:
    with DIRECT.open(f"{url}?wait={wait_s:g}&after={after}", timeout=wait_s + FETCH_TIMEOUT_S) as response:
        response.read(1 << 20)
        etag = response.headers.get("ETag")
    return etag.strip('"') if etag else None


class _Poll(threading.Thread):
    def __init__(self, changes: DaemonChanges, key: CacheKey, uid: str, url: str, after: str) -> None:
        super().__init__(name=f"daemon-changes-{uid[:8]}", daemon=True)
        self.changes, self.key, self.uid, self.url, self.after = changes, key, uid, url, after
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                etag = self.changes._poll(self.url, self.after, self.changes.wait_s)
            except urllib.error.HTTPError as error:
                if error.code in (400, 404, 405):  # a daemon that has no long poll: the re-reads cover it
                    log.info("daemon status has no long poll", extra={"url": self.url, "status": error.code})
                    return
                self.stopped.wait(BACKOFF_S)  # 503: its waiter cap is reached
                continue
            except OSError:
                self.stopped.wait(BACKOFF_S)
                continue
            if etag is None:
                log.info("daemon status has no long poll (no ETag)", extra={"url": self.url})
                return
            if etag != self.after:
                self.after = etag
                if not self.stopped.is_set():
                    self.changes._changed(self.key, self.uid)
            self.stopped.wait(MIN_INTERVAL_S)


class DaemonChanges:
    """Long polls of the daemon pods each pass names; calls ``wake(key)`` when one's report changes."""

    def __init__(
        self,
        reader: DaemonStatusReader,
        wake: Callable[[CacheKey], None],
        poll: LongPoll = http_long_poll,
        wait_s: float = WAIT_S,
        max_watched: int = MAX_WATCHED,
    ) -> None:
        self._reader = reader
        self._wake = wake
        self._poll = poll
        self.wait_s = wait_s
        self.max_watched = max_watched
        self._lock = threading.Lock()
        self._polls: dict[CacheKey, dict[str, _Poll]] = {}
        self._waking: set[CacheKey] = set()
        self._again: set[CacheKey] = set()
        self._over_cap_logged = False

    def watch(self, key: CacheKey, pods: list[dict[str, Any]], reports: Mapping[str, Fetched]) -> None:
        """From now on long-poll exactly ``key``'s Ready daemon pods among ``pods`` (``reports``:
        pod name → what the pass read of it): new ones start, gone ones (or a new IP) stop."""
        wanted: dict[str, tuple[str, str]] = {}
        for pod in pods:
            url = status_url(pod)
            if url is None or not PodView(pod).ready:
                continue
            meta = pod["metadata"]
            read = reports.get(meta["name"])
            wanted[meta.get("uid", meta["name"])] = (url, report_digest(read) if isinstance(read, DaemonReport) else "")
        with self._lock:
            polls = self._polls.setdefault(key, {})
            for uid in list(polls):
                if uid not in wanted or wanted[uid][0] != polls[uid].url:
                    polls.pop(uid).stopped.set()
            watched = sum(len(p) for p in self._polls.values())
            for uid, (url, after) in wanted.items():
                if uid in polls:
                    continue
                if watched >= self.max_watched:
                    if not self._over_cap_logged:
                        self._over_cap_logged = True
                        log.warning(
                            "daemon pods beyond the long-poll cap are re-read every recheck instead",
                            extra={"cap": self.max_watched},
                        )
                    break
                polls[uid] = _Poll(self, key, uid, url, after)
                polls[uid].start()
                watched += 1
            if not polls:
                del self._polls[key]

    def watched(self, key: CacheKey) -> int:
        with self._lock:
            return len(self._polls.get(key, {}))

    def forget(self, key: CacheKey) -> None:
        """Stop every long poll of ``key`` (the cache is gone, or this replica stopped acting for it)."""
        with self._lock:
            for poll in self._polls.pop(key, {}).values():
                poll.stopped.set()

    def _changed(self, key: CacheKey, uid: str) -> None:
        self._reader.invalidate(key, uid)
        with self._lock:
            if key in self._waking:
                self._again.add(key)  # the waking thread goes round once more
                return
            self._waking.add(key)
        threading.Thread(target=self._wake_until_quiet, args=(key,), name="daemon-changes-wake", daemon=True).start()

    def _wake_until_quiet(self, key: CacheKey) -> None:
        while True:
            try:
                self._wake(key)
            except Exception:  # noqa: BLE001 - a failed pass must not stop the next wake-up
                log.exception("pass after a daemon report changed failed")
            with self._lock:
                if key not in self._again:
                    self._waking.discard(key)
                    return
                self._again.discard(key)
