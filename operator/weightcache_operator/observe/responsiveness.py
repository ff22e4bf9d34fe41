"""Sub-second hang detection: the operator asks every Ready engine "are you there?" itself.

A frozen engine (a deadlock, a stuck device, SIGSTOP) sends no event: its pod stays Ready until
the kubelet's readiness probe times out, and Kubernetes probes cannot run more often than once a
second nor time out sooner than a second, so the kubelet's verdict takes 1-3 s. With
``spec.engine.failover.unresponsiveAfterMilliseconds`` set, this watch GETs each Ready engine's
readiness endpoint every ``INTERVAL_SECONDS`` from the operator, one thread per pod (a frozen
engine holds its request for the whole timeout; it must not delay the others' probes), and calls
``wake`` when a pod's verdict turns, so a pass acts on it at once (failures.failure_of's
``Unresponsive``).

The verdict is relative: a pod is unresponsive once it has answered nothing for the timeout
*while another engine of the same cache answered a probe sent after its silence began*. A stall
of the watcher itself (a busy operator node, the network between) silences every pod at once and
so judges none; and with no answering peer there is nobody to hand the Service to anyway.

An answer is any HTTP status: a 503 from a draining or not-ready engine is the kubelet's business
(and the plan's, through Ready); this watch only catches silence.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

INTERVAL_SECONDS = 0.1
"""How often each engine is asked: a tenth of the kubelet's fastest period, so detection is the
timeout plus at most this."""


def probe_url(pod: dict[str, Any]) -> str | None:
    """``http://<pod IP>:<port><path>`` of the engine container's readinessProbe HTTP GET (the
    first container, as render.engine treats it); None when the pod has no IP yet or its probe is
    no HTTP GET (exec, tcpSocket, grpc: nothing to ask here)."""
    ip = (pod.get("status") or {}).get("podIP")
    spec = next(iter((pod.get("spec") or {}).get("containers") or []), None)
    get = ((spec or {}).get("readinessProbe") or {}).get("httpGet")
    if not ip or not get or (get.get("scheme") or "HTTP").upper() != "HTTP":
        return None
    port = get.get("port")
    if isinstance(port, str) and not port.isdigit():  # a named port
        port = next((p.get("containerPort") for p in (spec or {}).get("ports") or [] if p.get("name") == port), None)
    if port is None:
        return None
    host = f"[{ip}]" if ":" in ip else ip
    path = get.get("path") or "/"
    return f"http://{host}:{int(port)}{path if path.startswith('/') else '/' + path}"


def answers(url: str, timeout: float) -> bool:
    """Whether ``url`` answers a GET with any HTTP status within ``timeout`` (per socket step)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/", headers={"Connection": "close"})
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


@dataclass
class _Seen:
    """What one pod's probes showed, in monotonic seconds (and the wall clock of the silence's
    start, which is what the failover record measures detection from)."""

    answered_sent: float | None = None
    """When the latest probe that got an answer was sent."""
    silent_since: float | None = None
    """When the first probe of the current silence was sent; None while it answers."""
    silent_wall: datetime | None = None


class _Probe(threading.Thread):
    def __init__(self, watch: ResponsivenessWatch, key: Hashable, pod: str, url: str, timeout: float) -> None:
        super().__init__(name=f"responsiveness-{pod}", daemon=True)
        self.watch, self.key, self.pod, self.url, self.timeout = watch, key, pod, url, timeout
        self.seen = _Seen()
        self.stopped = threading.Event()

    def run(self) -> None:
        due = time.monotonic()
        while not self.stopped.wait(max(0.0, due - time.monotonic())):
            sent, wall = time.monotonic(), datetime.now(UTC)
            due = sent + self.watch.interval
            answered = answers(self.url, self.timeout)
            if not self.stopped.is_set():
                self.watch._record(self, sent, wall, answered)


class ResponsivenessWatch:
    """Probes the engines each pass names; tells which stopped answering. Thread-safe."""

    def __init__(self, wake: Callable[[Hashable], None], interval: float = INTERVAL_SECONDS) -> None:
        self._wake = wake
        self.interval = interval
        self._lock = threading.Lock()
        self._probes: dict[Hashable, dict[str, _Probe]] = {}
        self._judged: dict[Hashable, frozenset[str]] = {}

    def watch(self, key: Hashable, urls: Mapping[str, str], timeout: float) -> None:
        """From now on probe exactly ``urls`` (pod name → readiness URL) for ``key``, each answer
        awaited ``timeout`` seconds: new pods start being probed, gone ones stop, a pod whose URL
        changed (a new IP) starts afresh. Empty ``urls``: stop watching ``key``."""
        with self._lock:
            probes = self._probes.setdefault(key, {})
            for pod in list(probes):
                old = probes[pod]
                if urls.get(pod) != old.url or old.timeout != timeout:
                    old.stopped.set()
                    del probes[pod]
            for pod, url in urls.items():
                if pod not in probes:
                    probes[pod] = _Probe(self, key, pod, url, timeout)
                    probes[pod].start()
            if not probes:
                del self._probes[key]
                self._judged.pop(key, None)

    def forget(self, key: Hashable) -> None:
        self.watch(key, {}, 0.0)

    def unresponsive(self, key: Hashable) -> dict[str, datetime]:
        """Pod name → when it fell silent, for ``key``'s pods judged unresponsive now."""
        with self._lock:
            return self._verdict(key, time.monotonic())

    def _record(self, probe: _Probe, sent: float, wall: datetime, answered: bool) -> None:
        with self._lock:
            if self._probes.get(probe.key, {}).get(probe.pod) is not probe:
                return  # replaced or stopped while its request was out
            seen = probe.seen
            if answered:
                seen.answered_sent, seen.silent_since, seen.silent_wall = sent, None, None
            elif seen.silent_since is None:
                seen.silent_since, seen.silent_wall = sent, wall
            judged = frozenset(self._verdict(probe.key, time.monotonic()))
            turned = judged - self._judged.get(probe.key, frozenset())
            self._judged[probe.key] = judged
        if turned:
            # Off this thread: a pass can take a while, and this pod's probes must go on.
            threading.Thread(target=self._wake, args=(probe.key,), name="responsiveness-wake", daemon=True).start()

    def _verdict(self, key: Hashable, now: float) -> dict[str, datetime]:
        probes = self._probes.get(key, {})
        found: dict[str, datetime] = {}
        for pod, probe in probes.items():
            since = probe.seen.silent_since
            if since is None or now - since < probe.timeout:
                continue
            peer_answered = any(
                other.seen.answered_sent is not None and other.seen.answered_sent > since
                for name, other in probes.items()
                if name != pod
            )
            if peer_answered:
                assert probe.seen.silent_wall is not None
                found[pod] = probe.seen.silent_wall
        return found
