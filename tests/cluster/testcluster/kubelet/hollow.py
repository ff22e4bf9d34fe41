"""Hollow nodes, as kubemark has them: a control-plane simulation for scale tests.

A ``HollowFleet`` registers hundreds of Nodes that look real to the API server, the scheduler,
the controllers and the operator (Ready, Lease renewed every 10 s as the real kubelet does,
capacity, InternalIP), and plays the kubelet for the pods bound to them without running any
process: a pod gets an IP and a status (Running, container statuses, Ready once its readiness
gates pass), a deleted pod is removed at once. The status endpoints of hollow daemon pods are
answered by one thread (hollowdaemons.py) with what the test sets per node.

Cheap by construction: one thread schedules every Lease renewal (spread over the period) and a
few send them, one thread watches pods, a few write pod statuses (bursts coalesced per pod), one
serves every hollow daemon endpoint; nothing per node or per pod. A pod's status is written when
what the API server holds differs from what its hollow kubelet says, as the kubelet's status
manager does: the node lifecycle controller's "not ready" on a node that missed its Lease is put
right once the node is back. Node status is posted at registration, on a
change the test makes (``set_node_ready``) and every 5 minutes (the kubelet's
nodeStatusReportFrequency), never per heartbeat.

The cluster's ``--node-monitor-grace-period`` must exceed the lease period (the real default,
40 s or more), or the node lifecycle controller marks hollow nodes NotReady between renewals.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..reflector import follow
from ..rest import ApiError, Kube, Object
from .hollowdaemons import HollowDaemonServer, HollowDaemonState, daemon_of
from .nodes import KUBELET_VERSION, LEASE_DURATION_SECONDS, NodeSpec, now_rfc3339
from .podnetwork import NodeAddresses, ensure_pod_network
from .pods import delete_pod_object

log = logging.getLogger(__name__)

LEASE_PERIOD_S = 10.0
STATUS_REPORT_PERIOD_S = 300.0
STATUS_WRITERS = 4
LEASE_WRITERS = 8
"""Renewals in flight at once: one after another, 500 nodes leave each renewal 20 ms, and an API
server that answers slower would let Leases lapse (each real node renews its own)."""


class _Addresses:
    """IPs from as many /24s of the pod network as the fleet needs (claimed like a node's)."""

    def __init__(self) -> None:
        self._routable = ensure_pod_network()
        self._pools: list[NodeAddresses] = []
        self._lock = threading.Lock()

    def allocate(self) -> str:
        with self._lock:
            for pool in self._pools:
                try:
                    return pool.allocate()
                except RuntimeError:
                    continue
            self._pools.append(NodeAddresses(self._routable))
            return self._pools[-1].allocate()

    def release(self, address: str) -> None:
        with self._lock:
            for pool in self._pools:
                pool.release(address)

    def close(self) -> None:
        for pool in self._pools:
            pool.close()


@dataclass
class _Pod:
    namespace: str
    name: str
    uid: str
    node: str
    ip: str
    started: str
    pod: Object
    written: tuple[Any, ...] | None = None
    transitions: dict[str, tuple[str, str]] = field(default_factory=dict)


class HollowFleet:
    def __init__(self, kube: Kube, nodes: list[NodeSpec], lease_period: float = LEASE_PERIOD_S) -> None:
        self.kube = kube
        self.specs = {spec.name: spec for spec in nodes}
        self.lease_period = lease_period
        self._addresses = _Addresses()
        self._node_ips: dict[str, str] = {}
        self._node_ready: dict[str, bool] = dict.fromkeys(self.specs, True)
        self._leasing: dict[str, bool] = dict.fromkeys(self.specs, True)
        self._posted: dict[str, float] = {}
        self._daemon_states: dict[str, HollowDaemonState] = {}
        self._pods: dict[str, _Pod] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._dirty: dict[str, None] = {}
        self._wake = threading.Condition()
        self.daemons = HollowDaemonServer(self.daemon_state)
        self._threads: list[threading.Thread] = []
        self._lease_pool = ThreadPoolExecutor(max_workers=LEASE_WRITERS, thread_name_prefix="hollow-lease")
        self._renewing: set[str] = set()
        self.writes = 0
        """Requests this fleet sent (leases, node and pod status, deletions)."""

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self.daemons.start()
        with ThreadPoolExecutor(max_workers=8, thread_name_prefix="hollow-register") as pool:
            list(pool.map(self._register, self.specs))
        resource_version = self._relist()
        self._spawn(self._beat, "hollow-leases")
        self._spawn(self._watch, "hollow-pod-watch", resource_version)
        for i in range(STATUS_WRITERS):
            self._spawn(self._write_loop, f"hollow-status-{i}")

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)
        self._lease_pool.shutdown(wait=False, cancel_futures=True)
        self.daemons.stop()
        self._addresses.close()

    def _spawn(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        self._threads.append(thread)
        thread.start()

    # -- what a test controls --------------------------------------------------------------------

    def set_node_ready(self, node: str, ready: bool) -> None:
        """Posts the node's Ready condition, as a kubelet does whose runtime failed or recovered."""
        with self._lock:
            self._node_ready[node] = ready
        self._post_status(node)
        if ready:
            self._repost_pods(node)

    def set_leasing(self, node: str, on: bool) -> None:
        """Stops (or resumes) the node's Lease renewals, like a node that lost power: the node
        lifecycle controller marks it NotReady after its grace period."""
        with self._lock:
            self._leasing[node] = on
        if on:
            self._post_status(node)
            self._renew(node)
            self._repost_pods(node)

    def _repost_pods(self, node: str) -> None:
        """A node back to Ready: its kubelet posts its pods' status again (the node lifecycle
        controller marked them not ready meanwhile)."""
        with self._lock:
            records = [p for p in self._pods.values() if p.node == node]
            for record in records:
                record.written = None
        for record in records:
            self._mark(record.uid)

    def set_daemon(self, node: str, state: HollowDaemonState) -> None:
        """What the node's hollow daemons report from now on; their pods' Ready follows."""
        with self._lock:
            self._daemon_states[node] = state
            uids = [p.uid for p in self._pods.values() if p.node == node and daemon_of(p.pod)]
        for uid in uids:
            self._mark(uid)

    def daemon_state(self, node: str) -> HollowDaemonState:
        # No lock: the daemon endpoints' thread asks while a pod event may hold it (one dict read).
        return self._daemon_states.get(node, HollowDaemonState())

    def pods_on(self, node: str) -> list[str]:
        with self._lock:
            return [f"{p.namespace}/{p.name}" for p in self._pods.values() if p.node == node]

    # -- nodes -----------------------------------------------------------------------------------

    def _register(self, name: str) -> None:
        spec = self.specs[name]
        self._node_ips[name] = self._addresses.allocate()
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {**labels, **spec.labels}},
            "spec": {"taints": spec.taints} if spec.taints else {},
        }
        try:
            self.kube.create("/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:
                raise
        self._post_status(name)
        self._renew(name)

    def _beat(self) -> None:
        """Renews every leasing node once per period, spread evenly over it; a node whose last
        renewal is still in flight is not asked again (a slow API server costs renewals, not a
        growing queue)."""
        while not self._stop.is_set():
            names = sorted(self.specs)
            gap = self.lease_period / max(1, len(names))
            started = time.monotonic()
            for i, name in enumerate(names):
                if self._stop.wait(max(0.0, started + i * gap - time.monotonic())):
                    return
                with self._lock:
                    if not self._leasing[name] or name in self._renewing:
                        continue
                    self._renewing.add(name)
                self._lease_pool.submit(self._heartbeat, name)
            self._stop.wait(max(0.0, started + self.lease_period - time.monotonic()))

    def _heartbeat(self, name: str) -> None:
        try:
            self._renew(name)
            if time.monotonic() - self._posted.get(name, 0.0) >= STATUS_REPORT_PERIOD_S:
                self._post_status(name)
        except Exception:  # noqa: BLE001 - a missed renewal is what the controller is for
            log.exception("lease of hollow node %s", name)
        finally:
            with self._lock:
                self._renewing.discard(name)

    def _renew(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        spec = {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION_SECONDS, "renewTime": now_rfc3339(True)}
        self.writes += 1
        try:
            self.kube.patch(path, {"spec": spec}, content_type="application/merge-patch+json")
        except ApiError as error:
            if error.status != 404:
                raise
            node = self.kube.get(f"/api/v1/nodes/{name}")
            owner = {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}
            self.kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {"metadata": {"name": name, "ownerReferences": [owner]}, "spec": spec},
            )

    def _post_status(self, name: str) -> None:
        spec, stamp = self.specs[name], now_rfc3339()
        with self._lock:
            ready = self._node_ready[name]

        def condition(kind: str, status: str, reason: str) -> dict[str, str]:
            return {"type": kind, "status": status, "reason": reason, "message": "hollow node",
                    "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}  # fmt: skip

        status = {
            "capacity": spec.capacity,
            "allocatable": spec.capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID"),
                condition("Ready", "True", "KubeletReady") if ready else condition("Ready", "False", "KubeletNotReady"),
            ],
            "addresses": [{"type": "InternalIP", "address": self._node_ips[name]}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": name, "systemUUID": name, "bootID": name, "kernelVersion": "",
                "osImage": "weightcache hollow node", "containerRuntimeVersion": "hollow://1",
                "kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }  # fmt: skip
        self.writes += 1
        self._posted[name] = time.monotonic()
        self.kube.patch(f"/api/v1/nodes/{name}/status", {"status": status})

    # -- pods ------------------------------------------------------------------------------------

    def _watch(self, resource_version: str) -> None:
        follow(
            self.kube,
            "/api/v1/pods",
            relist=self._relist,
            on_event=self._handle,
            stopped=self._stop,
            what="hollow pod watch",
            resource_version=resource_version,
            retry_s=0.5,
        )

    def _relist(self) -> str:
        listing = self.kube.get("/api/v1/pods")
        for pod in listing.get("items", []):
            self._handle("MODIFIED", pod)
        return str(listing["metadata"]["resourceVersion"])

    def _handle(self, kind: str, pod: Object) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.specs:
            return
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            known = self._pods.get(uid)
            if kind == "DELETED" or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                if known is not None:
                    del self._pods[uid]
                    self.daemons.close(uid)
                    self._addresses.release(known.ip)
                return
            if meta.get("deletionTimestamp"):
                # Nothing runs: the containers are gone at once, and the kubelet removes the object.
                threading.Thread(
                    target=delete_pod_object, args=(self.kube, meta["namespace"], meta["name"], uid), daemon=True
                ).start()
                return
            if known is None:
                ip = (pod.get("status") or {}).get("podIP") or self._addresses.allocate()
                known = _Pod(meta["namespace"], meta["name"], uid, node, ip, now_rfc3339(), pod)
                self._pods[uid] = known
                daemon = daemon_of(pod)
                if daemon is not None:
                    port = next(
                        (p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports") or []
                         if p.get("name") == "status"),
                        9400,
                    )  # fmt: skip
                    self.daemons.serve(uid, ip, port, node, daemon)
            else:
                known.pod = pod
        self._mark(uid)

    def _mark(self, uid: str) -> None:
        with self._wake:
            self._dirty[uid] = None
            self._wake.notify()

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._stop.is_set():
                    self._wake.wait()
                if self._stop.is_set():
                    return
                uid = next(iter(self._dirty))
                del self._dirty[uid]
            with self._lock:
                record = self._pods.get(uid)
                status = self._status(record) if record is not None else None
                if record is None or status is None:
                    continue
                key = _status_key(status)
                if record.written == key and _status_key(record.pod.get("status") or {}, key) == key:
                    continue  # the API already says so: the echo of our patch, or an event that changes nothing here
                record.written = key
            try:
                self.writes += 1
                self.kube.patch(
                    f"/api/v1/namespaces/{record.namespace}/pods/{record.name}/status",
                    {"metadata": {"uid": uid}, "status": status},
                )
            except ApiError as error:
                if error.status not in (404, 409):
                    log.warning("status of hollow pod %s/%s: %s", record.namespace, record.name, error)
                with self._lock:
                    record.written = None
            except Exception:  # noqa: BLE001 - the next event writes again
                log.exception("status of hollow pod %s/%s", record.namespace, record.name)
                with self._lock:
                    record.written = None

    def _status(self, record: _Pod) -> dict[str, Any] | None:
        pod = record.pod
        containers_ready = daemon_of(pod) is None or self.daemon_state(record.node).ready
        gates = [g["conditionType"] for g in pod["spec"].get("readinessGates") or []]
        seen = {c["type"]: c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        gates_pass = all(seen.get(gate) == "True" for gate in gates)
        ready = containers_ready and gates_pass

        def condition(kind: str, value: bool) -> dict[str, Any]:
            status = "True" if value else "False"
            before = record.transitions.get(kind)
            if before is None or before[0] != status:
                record.transitions[kind] = (status, now_rfc3339())
            return {
                "type": kind,
                "status": status,
                "lastTransitionTime": record.transitions[kind][1],
                "lastProbeTime": None,
            }

        def running(spec: Object) -> dict[str, Any]:
            return {
                "name": spec["name"], "image": spec.get("image", ""), "imageID": "",
                "containerID": f"hollow://{record.uid}/{spec['name']}", "ready": containers_ready,
                "started": True, "restartCount": 0, "state": {"running": {"startedAt": record.started}},
            }  # fmt: skip

        def completed(spec: Object) -> dict[str, Any]:
            done = {"exitCode": 0, "reason": "Completed", "startedAt": record.started, "finishedAt": record.started}
            return {"name": spec["name"], "image": spec.get("image", ""), "imageID": "", "ready": True,
                    "started": False, "restartCount": 0, "state": {"terminated": done}}  # fmt: skip

        status: dict[str, Any] = {
            "phase": "Running",
            "conditions": [
                condition("PodReadyToStartContainers", True),
                condition("Initialized", True),
                condition("ContainersReady", containers_ready),
                condition("Ready", ready),
            ],
            "hostIP": self._node_ips[record.node],
            "hostIPs": [{"ip": self._node_ips[record.node]}],
            "podIP": record.ip,
            "podIPs": [{"ip": record.ip}],
            "startTime": record.started,
            "containerStatuses": [running(c) for c in pod["spec"]["containers"]],
        }
        init = pod["spec"].get("initContainers") or []
        if init:
            status["initContainerStatuses"] = [
                running(c) if c.get("restartPolicy") == "Always" else completed(c) for c in init
            ]
        return status


def _status_key(status: Object, like: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
    """What a hollow kubelet decides of a pod status: its phase and the status of each condition
    it sets (those of ``like``'s when given; other writers' conditions, the readiness gates, are
    not its own)."""
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    kinds = [kind for kind, _ in like[1]] if like is not None else list(conditions)
    return (status.get("phase"), tuple((kind, conditions.get(kind)) for kind in kinds))
