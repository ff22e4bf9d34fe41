"""What the network-fault scenarios share: a node cut off or slowed for the length of a block,
healed whatever happens (``fault``), and a watch of what the Service's clients are offered
(``ServiceWatch``): its ready endpoints and the engine pods labelled active, sampled until
stopped. The faults are the nodes' own networks (testcluster/kubelet/nodenetwork.py)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from operator_e2e import by_role, wait_phase
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import ApiError, Kube
from testcluster.sample import NAME
from testcluster.serviceproxy import EndpointChange, ServiceProxy
from testcluster.waiting import wait_for


@contextmanager
def fault(kubelet: ProcessKubelet, node: str, kind: str, **shape: float) -> Iterator[float]:
    """``kind`` is cut, cut-api or slow (``rate_kbit``, ``loss``) on ``node`` for the block,
    which gets the moment it began (time.time); healed on the way out, even on a failure, so no
    later test of the session finds a node cut off."""
    network = kubelet.network(node)
    began = time.time()
    try:
        if kind == "cut":
            kubelet.cut(node)
        elif kind == "cut-api":
            kubelet.cut(node, only_api=True)
        elif kind == "slow":
            network.shape(int(shape["rate_kbit"]), shape.get("loss", 0.0))
        else:
            raise ValueError(f"no fault {kind!r}: cut, cut-api or slow")
        print(f"{node}: {kind} {shape or ''} -> {network.faults()}")
        yield began
    finally:
        kubelet.heal(node)


def cache_path(namespace: str, name: str = NAME) -> str:
    return f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{name}"


def gone(kube: Kube, namespace: str, pod: str) -> bool:
    """Whether the pod object is deleted (not only being deleted)."""
    try:
        kube.get(f"/api/v1/namespaces/{namespace}/pods/{pod}")
    except ApiError as error:
        return error.status == 404
    return False


def failover_to(kube: Kube, namespace: str, standby: str) -> dict:
    """Waits for the status to record the failover to ``standby``; returns ``lastFailover``."""
    return wait_for(
        lambda: (f := kube.get(cache_path(namespace))["status"].get("lastFailover") or {}).get("to") == standby and f,
        30,
    )


def rejoined(
    kube: Kube, namespace: str, operator: subprocess.Popen, node: str, old: str, new: str
) -> tuple[dict, float]:
    """After a cut ``node`` heals: waits for it Ready, for the old active ``old`` to be retired
    (its kubelet sees the deletion it missed) and for the cache whole again with ``new`` active
    and one standby. Returns that status and the seconds from the node Ready to it."""
    healed_at = wait_node(kube, node, ready=True)
    wait_for(lambda: gone(kube, namespace, old), 120, describe=f"{old} was never retired")
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        also=lambda s: s["engines"][0]["active"] == new and len(s["engines"][0]["standbys"]) == 1,
    )
    return status, time.time() - healed_at


def assert_one_active_after(
    watch: ServiceWatch, changes: list[EndpointChange], switched: EndpointChange, old: str, promoted_at: float
) -> None:
    """Once the failover is done, no other engine is ever active again, and the Service never
    offers the old endpoint ``old``, nor two at once, also after the node is back."""
    assert watch.most_actives(since=promoted_at) == 1, [s for s in watch.samples if len(s.actives) > 1][:3]
    after = changes[changes.index(switched) :]
    assert all(old not in c.ready and len(c.ready) <= 1 for c in after), after


def node_ready(kube: Kube, node: str) -> bool:
    conditions = kube.get(f"/api/v1/nodes/{node}")["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_node(kube: Kube, node: str, ready: bool, timeout: float = 60) -> float:
    """Waits for ``node`` to turn Ready (or NotReady); returns when it was seen (time.time)."""
    wait_for(lambda: node_ready(kube, node) == ready, timeout, interval=0.2, describe=f"{node} Ready != {ready}")
    return time.time()


def gaps(changes: list[EndpointChange]) -> list[tuple[float, float]]:
    """The windows (from, to; time.time) in which the proxy had no ready endpoint, by the
    changes it saw: each from a change to an empty set until the next change."""
    return [(c.observed_at, n.observed_at) for c, n in zip(changes, changes[1:], strict=False) if not c.ready]


def outside(failures: list[str], windows: list[tuple[float, float]], slack: float = 1.0) -> list[str]:
    """The failed requests (``LoadResult.failed``: "HH:MM:SS error", today) that fell outside every
    window, with ``slack`` seconds either side for the stamp's one-second resolution."""
    today = time.strftime("%Y-%m-%d ")

    def when(failure: str) -> float:
        return time.mktime(time.strptime(today + failure.split(" ", 1)[0], "%Y-%m-%d %H:%M:%S"))

    return [f for f in failures if not any(a - slack <= when(f) <= b + slack for a, b in windows)]


@dataclass
class Sample:
    at: float
    endpoints: tuple[str, ...]
    actives: tuple[str, ...]


@dataclass
class ServiceWatch:
    """Samples every ``every`` seconds the proxy's ready endpoints and the engine pods labelled
    active (not being deleted) until ``stop``."""

    kube: Kube
    namespace: str
    proxy: ServiceProxy
    every: float = 0.1
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="service-watch")

    def start(self) -> ServiceWatch:
        self._thread.start()
        return self

    def stop(self) -> list[Sample]:
        self._stop.set()
        self._thread.join()
        return self.samples

    def _run(self) -> None:
        while not self._stop.is_set():
            actives = tuple(by_role(self.kube, self.namespace)["active"])
            self.samples.append(Sample(time.time(), self.proxy.ready_endpoints, actives))
            self._stop.wait(self.every)

    def most_actives(self, since: float = 0.0) -> int:
        """The most engine pods labelled active at once in the samples taken from ``since`` on.
        (In a failover's own pass the new active is labelled a moment before the old one is
        deleted: count from when the failover was seen done.)"""
        return max((len(s.actives) for s in self.samples if s.at >= since), default=0)

    def without_endpoint(self) -> list[Sample]:
        """The samples in which the Service offered no ready endpoint at all."""
        return [s for s in self.samples if not s.endpoints]
