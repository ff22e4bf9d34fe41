"""Reading the daemon pods' status endpoints (``GET http://<podIP>:9400/status``).

The daemons hold no Kubernetes API rights; the operator asks them instead. A pass must never
wait long on a wedged daemon, so each read has a short timeout, pods are read in parallel, a
failure becomes a message in ``status.nodes[].reportError`` instead of an exception, and a pod is
read again only when the API server says it changed (its uid or resourceVersion: readiness flips
change it) — a pass triggered by an engine pod's event costs no HTTP request at all. A failed read
is retried after ``RETRY_FAILED_S`` even if the pod did not change, so a transient error does not
stick to a pod that stays Ready for days; so is a report of ranks not ready, because what a loading
or waiting daemon says (status_note.py) changes while its pod does not, and one whose checkpoint
is being verified or has changed. A ready report is read again after ``RECHECK_READY_S``: the
checkpoint can change under a Ready daemon, and its report is the one place that says so
(checkpoint_watch.py); with passes at least every resync period, that is about one request per
daemon pod per ``RECHECK_READY_S``. That re-read is the safety net: a Ready daemon pod's report
changing is heard within about a second by its long poll (daemon_changes.py), which marks the
pod's report stale here (``invalidate``) and wakes a pass.

The parallel reads of every pass share one pool of ``MAX_CONCURRENT_READS`` threads, whatever the
number of caches and of passes running at once: a fleet of hundreds of daemons, or many of them
wedged at once, costs the operator a fixed number of threads and sockets, and a pass waits at
most ``timeout_s`` per round of reads.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pydantic import ValidationError
from weightcache_contract.daemon_report import DaemonReport

from weightcache_operator.vocabulary import STATUS_PORT, STATUS_PORT_NAME

FETCH_TIMEOUT_S = 2.0
MAX_CONCURRENT_READS = 16
RETRY_FAILED_S = 10.0
RECHECK_READY_S = 30.0
MAX_REPORT_BYTES = 1 << 20
"""A report is a few hundred bytes per rank; anything near this is not one."""

Fetched = DaemonReport | str
"""The daemon's report, or why it could not be read."""
Fetch = Callable[[str, float], DaemonReport]

# Pod IPs are reached directly: an HTTP(S)_PROXY in the operator's environment must not route
# (or log) in-cluster status requests.
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def status_url(pod: dict[str, Any]) -> str | None:
    """The pod's status URL, from its IP and the container port named ``status``; None without an IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    ports = [p for c in (pod.get("spec") or {}).get("containers") or [] for p in c.get("ports") or []]
    port = next((p["containerPort"] for p in ports if p.get("name") == STATUS_PORT_NAME), STATUS_PORT)
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}/status"


def http_fetch(url: str, timeout_s: float) -> DaemonReport:
    with DIRECT.open(url, timeout=timeout_s) as response:
        return DaemonReport.model_validate_json(response.read(MAX_REPORT_BYTES + 1)[:MAX_REPORT_BYTES])


def _checkpoint_moving(report: DaemonReport) -> bool:
    """Some rank's checkpoint is being verified or has changed: what it says next matters soon."""
    return any(r.checkpoint is not None and r.checkpoint.state != "unchanged" for r in report.ranks)


class DaemonStatusReader:
    """Remembers, per cache, the last report of each daemon pod and the pod version it was read at."""

    def __init__(
        self,
        fetch: Fetch = http_fetch,
        timeout_s: float = FETCH_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        max_concurrent: int = MAX_CONCURRENT_READS,
        counted: Callable[[int], None] = lambda _reads: None,
    ) -> None:
        self._fetch = fetch
        self.timeout_s = timeout_s
        self._clock = clock
        self._counted = counted
        self._pool = ThreadPoolExecutor(max_workers=max_concurrent, thread_name_prefix="daemon-status")
        self._inflight = 0
        self._lock = threading.Lock()
        self.most_concurrent = 0
        """The most reads that were ever in flight at once (never above ``max_concurrent``)."""
        # cache → pod uid → (pod version, when read, what was read)
        self._memo: dict[tuple[str, str], dict[str, tuple[tuple[str, str], float, Fetched]]] = {}
        # cache → pod uids whose report changed since the last read began (``invalidate``): taken
        # when a read begins, so one landing while that read is out is kept for the next.
        self._stale: dict[tuple[str, str], set[str]] = {}

    def read(self, cache: tuple[str, str], pods: list[dict[str, Any]], refresh: bool = False) -> dict[str, Fetched]:
        """Pod name → report (or the reason there is none) for each of ``cache``'s daemon pods;
        ``refresh`` reads every pod again (free memory changes without the pod changing)."""
        before = {} if refresh else self._memo.get(cache, {})
        with self._lock:
            stale = self._stale.pop(cache, set())
        now = self._clock()
        kept: dict[str, tuple[tuple[str, str], float, Fetched]] = {}
        todo: list[tuple[str, tuple[str, str], str]] = []
        names: dict[str, str] = {}
        for pod in pods:
            meta = pod["metadata"]
            uid, version = meta.get("uid", meta["name"]), (meta.get("resourceVersion", ""), meta["name"])
            names[uid] = meta["name"]
            if uid in before and before[uid][0] == version and uid not in stale:
                _version, read_at, fetched = before[uid]
                settled = isinstance(fetched, DaemonReport) and fetched.ready and not _checkpoint_moving(fetched)
                if now - read_at < (RECHECK_READY_S if settled else RETRY_FAILED_S):
                    kept[uid] = before[uid]
                    continue
            url = status_url(pod)
            if url is None:
                kept[uid] = (version, now, "the pod has no IP yet")
            else:
                todo.append((uid, version, url))
        if todo:
            self._counted(len(todo))
            for (uid, version, _url), fetched in zip(todo, self._pool.map(lambda t: self._one(t[2]), todo)):
                kept[uid] = (version, now, fetched)
        self._memo[cache] = kept  # pods that are gone are dropped with the old map
        return {names[uid]: fetched for uid, (_version, _at, fetched) in kept.items()}

    def known(self, cache: tuple[str, str]) -> dict[str, Fetched]:
        """Pod uid → the report last read for it (or why there is none), without reading anything:
        what planning may use without waiting on a daemon (plan/seeding.py)."""
        return {uid: fetched for uid, (_version, _at, fetched) in self._memo.get(cache, {}).items()}

    def invalidate(self, cache: tuple[str, str], uid: str) -> None:
        """The pod's report is known to have changed: the next ``read`` asks it again."""
        with self._lock:
            self._stale.setdefault(cache, set()).add(uid)

    def forget(self, cache: tuple[str, str]) -> None:
        self._memo.pop(cache, None)
        with self._lock:
            self._stale.pop(cache, None)

    def _one(self, url: str) -> Fetched:
        with self._lock:
            self._inflight += 1
            self.most_concurrent = max(self.most_concurrent, self._inflight)
        try:
            return self._fetch(url, self.timeout_s)
        except ValidationError as exc:
            return f"GET {url}: not a daemon report ({exc.error_count()} schema errors)"
        except (OSError, ValueError) as exc:  # refused, timed out, HTTP error status, bad JSON
            return f"GET {url}: {exc}"
        finally:
            with self._lock:
                self._inflight -= 1
