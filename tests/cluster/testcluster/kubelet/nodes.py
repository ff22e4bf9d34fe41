"""Node registration and liveness: the Node object, its Lease heartbeat, failure and recovery."""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass, field

from ..rest import ApiError, Kube

log = logging.getLogger(__name__)

KUBELET_VERSION = "v1.35.4"
LEASE_DURATION_SECONDS = 40


def now_rfc3339(micro: bool = False) -> str:
    moment = datetime.datetime.now(datetime.UTC)
    if micro:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class NodeSpec:
    """What a test wants a node to look like; capacity doubles as allocatable."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(
        default_factory=lambda: {
            "cpu": "8",
            "memory": "32Gi",
            "pods": "110",
            "ephemeral-storage": "100Gi",
            "nvidia.com/gpu": "8",
        }
    )
    taints: list[dict[str, str]] = field(default_factory=list)


class NodeAgent:
    """Keeps one Node registered and Ready by renewing its Lease every ``heartbeat`` seconds.

    The node lifecycle controller watches the Lease: when renewals stop (``fail``) it marks the
    node NotReady after --node-monitor-grace-period and the pods on it not ready, which is the
    failure a weightcache failover must survive. ``recover`` resumes renewals and re-posts Ready.
    """

    def __init__(self, kube: Kube, spec: NodeSpec, node_ip: str, heartbeat: float = 1.0, kubelet_port: int = 0) -> None:
        self.kube = kube
        self.spec = spec
        self.node_ip = node_ip
        self.heartbeat = heartbeat
        self.kubelet_port = kubelet_port
        self._alive = threading.Event()
        self._beating = threading.Lock()
        """Held through each beat, so that no beat that began before ``fail`` writes after it."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def alive(self) -> bool:
        return self._alive.is_set()

    def register(self) -> None:
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.spec.labels,
        }
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels},
            "spec": {"taints": self.spec.taints} if self.spec.taints else {},
        }
        try:
            self.kube.create("/api/v1/nodes", body)
        except ApiError as error:
            if error.status != 409:
                raise
            self.kube.patch(f"/api/v1/nodes/{self.name}", {"metadata": {"labels": labels}})
        self._post_status()
        self._renew_lease()
        self._alive.set()
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"heartbeat-{self.name}")
        self._thread.start()

    def fail(self) -> None:
        """Stops heartbeats, like a node that lost power; the pods' processes are the kubelet's job.
        Waits for a beat under way: one that read the node NotReady after this would post it
        Ready again."""
        with self._beating:
            self._alive.clear()

    def recover(self) -> None:
        self._post_status()
        self._renew_lease()
        self._alive.set()

    def stop(self) -> None:
        self._stop.set()
        self._alive.clear()
        if self._thread:
            self._thread.join(timeout=5)

    def _beat(self) -> None:
        ticks = 0
        while not self._stop.wait(self.heartbeat):
            with self._beating:
                if not self._alive.is_set():
                    continue
                try:
                    self._renew_lease()
                    ticks += 1
                    # Re-post status when the controller has overwritten Ready (after a recovery)
                    # and every 10 beats anyway, so lastHeartbeatTime stays fresh.
                    if ticks % 10 == 0 or not self._ready_in_api():
                        self._post_status()
                except Exception:  # noqa: BLE001 - a missed beat is what the controller is for
                    log.exception("heartbeat of %s failed", self.name)

    def _ready_in_api(self) -> bool:
        node = self.kube.get(f"/api/v1/nodes/{self.name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node.get("status", {}).get("conditions", []))

    def _renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {
            "holderIdentity": self.name,
            "leaseDurationSeconds": LEASE_DURATION_SECONDS,
            "renewTime": now_rfc3339(micro=True),
        }
        try:
            self.kube.patch(path, {"spec": spec}, content_type="application/merge-patch+json")
        except ApiError as error:
            if error.status != 404:
                raise
            node = self.kube.get(f"/api/v1/nodes/{self.name}")
            owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node["metadata"]["uid"]}
            self.kube.create(
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                {"metadata": {"name": self.name, "ownerReferences": [owner]}, "spec": spec},
            )

    def _post_status(self) -> None:
        stamp = now_rfc3339()

        def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
            return {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": stamp,
                "lastTransitionTime": stamp,
            }

        status = {
            "capacity": self.spec.capacity,
            "allocatable": self.spec.capacity,
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "process kubelet"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "process kubelet"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "process kubelet"),
                condition("Ready", "True", "KubeletReady", "process kubelet is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.node_ip}, {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {
                "machineID": self.name,
                "systemUUID": self.name,
                "bootID": self.name,
                "kernelVersion": "",
                "osImage": "weightcache process kubelet",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
        self.kube.patch(f"/api/v1/nodes/{self.name}/status", {"status": status})
