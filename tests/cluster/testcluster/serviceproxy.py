"""A TCP proxy that follows a Service's EndpointSlices the way kube-proxy does.

Only ready endpoints receive new connections, picked round-robin; established connections are
left alone when an endpoint goes away (as with iptables conntrack). Each change of the ready
set is recorded with the moment this proxy saw it and, when the EndpointSlice controller
stamped one, the moment of the pod change that caused it
(``endpoints.kubernetes.io/last-change-trigger-time``), so benchmarks can say how long a
failover took to reach clients of the Service.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass

from .reflector import follow
from .rest import Kube, Object

log = logging.getLogger(__name__)

TRIGGER_TIME = "endpoints.kubernetes.io/last-change-trigger-time"


@dataclass(frozen=True)
class EndpointChange:
    """One change of the ready endpoint set, as observed by the proxy."""

    observed_at: float
    ready: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    trigger_time: float | None

    @property
    def latency(self) -> float | None:
        """Seconds from the triggering pod change to this proxy acting on it. The trigger time
        comes from a pod condition's lastTransitionTime, which has one-second resolution."""
        return None if self.trigger_time is None else self.observed_at - self.trigger_time


class ServiceProxy:
    def __init__(
        self, kube: Kube, namespace: str, service: str, port: int | str, listen_host: str = "127.0.0.1"
    ) -> None:
        self.kube = kube
        self.namespace = namespace
        self.service = service
        self.port = port
        self.changes: list[EndpointChange] = []
        self.sent_to: collections.Counter[str] = collections.Counter()
        self._slices: dict[str, list[str]] = {}
        self._ready: tuple[str, ...] = ()
        self._round_robin = itertools.count()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._listener = socket.create_server((listen_host, 0))
        self._port_name: str | None = None
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._listener.getsockname()[:2]
        return host, port

    @property
    def ready_endpoints(self) -> tuple[str, ...]:
        with self._lock:
            return self._ready

    def start(self) -> ServiceProxy:
        self._port_name = self._service_port_name()
        for target, name in ((self._follow_slices, "slices"), (self._accept, "accept")):
            thread = threading.Thread(target=target, daemon=True, name=f"proxy-{self.service}-{name}")
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._listener.close()

    def __enter__(self) -> ServiceProxy:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def wait_for_ready(self, count: int, timeout: float = 30.0) -> tuple[str, ...]:
        """Blocks until exactly ``count`` endpoints are ready; returns them."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._ready) != count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"{self.service}: wanted {count} ready endpoints, have {self._ready}")
                self._changed.wait(remaining)
            return self._ready

    # -- endpoints -------------------------------------------------------------------------------

    def _service_port_name(self) -> str:
        service = self.kube.get(f"/api/v1/namespaces/{self.namespace}/services/{self.service}")
        for port in service["spec"]["ports"]:
            if self.port in (port.get("name"), port["port"]):
                return port.get("name", "")
        raise ValueError(f"service {self.service} has no port {self.port!r}")

    def _follow_slices(self) -> None:
        path = f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices"
        selector = f"kubernetes.io/service-name={self.service}"

        def relist() -> str:
            listing = self.kube.get(path, labelSelector=selector)
            self._replace_slices({s["metadata"]["name"]: s for s in listing.get("items", [])})
            return str(listing["metadata"]["resourceVersion"])

        follow(
            self.kube,
            path,
            relist=relist,
            on_event=self._apply,
            stopped=self._stop,
            what=f"endpoint watch for {self.service}",
            labelSelector=selector,
        )

    def _replace_slices(self, slices: dict[str, Object]) -> None:
        with self._lock:
            self._slices = {name: self._ready_addresses(s) for name, s in slices.items()}
        self._publish(max((self._trigger_time(s) or 0 for s in slices.values()), default=0) or None)

    def _apply(self, kind: str, endpoint_slice: Object) -> None:
        name = endpoint_slice["metadata"]["name"]
        with self._lock:
            if kind == "DELETED":
                self._slices.pop(name, None)
            else:
                self._slices[name] = self._ready_addresses(endpoint_slice)
        self._publish(self._trigger_time(endpoint_slice))

    def _ready_addresses(self, endpoint_slice: Object) -> list[str]:
        port = next(
            (p.get("port") for p in endpoint_slice.get("ports") or [] if p.get("name", "") == self._port_name), None
        )
        if port is None:
            return []
        addresses = []
        for endpoint in endpoint_slice.get("endpoints") or []:
            # A missing "ready" means ready (the API's documented default).
            if endpoint.get("conditions", {}).get("ready", True) is not False:
                addresses.extend(f"{address}:{port}" for address in endpoint["addresses"])
        return addresses

    @staticmethod
    def _trigger_time(endpoint_slice: Object) -> float | None:
        stamp = (endpoint_slice["metadata"].get("annotations") or {}).get(TRIGGER_TIME)
        if not stamp:
            return None
        return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    def _publish(self, trigger_time: float | None) -> None:
        with self._changed:
            ready = tuple(sorted({a for addresses in self._slices.values() for a in addresses}))
            if ready == self._ready:
                return
            change = EndpointChange(
                time.time(),
                ready,
                tuple(sorted(set(ready) - set(self._ready))),
                tuple(sorted(set(self._ready) - set(ready))),
                trigger_time,
            )
            self._ready = ready
            self.changes.append(change)
            self._changed.notify_all()
        log.info("%s/%s endpoints now %s (latency %s)", self.namespace, self.service, ready, change.latency)

    # -- forwarding ------------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            ready = self._ready
            backend = ready[next(self._round_robin) % len(ready)] if ready else None
            if backend:
                self.sent_to[backend] += 1
        if backend is None:
            client.close()  # what kube-proxy's REJECT rule does for a Service without endpoints
            return
        host, port = backend.rsplit(":", 1)
        try:
            upstream = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        pending, lock = [2], threading.Lock()
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pump, args=(source, sink, pending, lock), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket, pending: list[int], lock: threading.Lock) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        # Half-close keeps the other direction flowing; the second pump to end closes both.
        with lock:
            pending[0] -= 1
            last = pending[0] == 0
        if last:
            source.close()
            sink.close()
