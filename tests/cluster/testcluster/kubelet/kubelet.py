"""The process kubelet: registers nodes and runs the pods bound to them as local processes."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..netns import entered
from ..reflector import follow
from ..rest import ApiError, Kube, Object
from .devices import GPU_RESOURCE, GpuPool
from .logserver import KUBELET_PORT, LogServer
from .nodenetwork import HOST_ADDRESS, NodeNetwork
from .nodes import NodeAgent, NodeSpec
from .podnetwork import NodeAddresses, ensure_pod_network
from .pods import PodContext, PodWorker, delete_pod_object
from .processes import mount_namespaces_available, remove_created_mount_points
from .statuswriter import StatusWriter

log = logging.getLogger(__name__)

TERMINAL_PHASES = ("Succeeded", "Failed")


@dataclass
class KubeletConfig:
    """Nodes and timings; the root directory holds every node's "host" filesystem and every
    pod's volumes and logs: ``<root>/nodes/<node>/root/...`` and ``<root>/pods/<ns>_<pod>_<uid>/``."""

    root: Path
    nodes: list[NodeSpec] = field(default_factory=lambda: [NodeSpec("node-1"), NodeSpec("node-2")])
    heartbeat: float = 1.0
    backoff_base: float = 1.0
    backoff_cap: float = 10.0
    environment: dict[str, str] = field(default_factory=dict)
    # Certificate and key for the nodes' log endpoint (``kubectl logs``); None: no endpoint.
    serving_cert: tuple[Path, Path] | None = None


class ProcessKubelet:
    def __init__(self, kube: Kube, api_port: int, config: KubeletConfig) -> None:
        self.kube = kube
        self.api_port = api_port
        self.config = config
        self.agents: dict[str, NodeAgent] = {}
        self.addresses: dict[str, NodeAddresses] = {}
        self.workers: dict[str, PodWorker] = {}
        self.finished_workers: list[PodWorker] = []
        self._failed_nodes: set[str] = set()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._watch_threads: list[threading.Thread] = []
        self.isolated = mount_namespaces_available()
        # A node's own traffic with the API server (heartbeats, its pod watch, status writes,
        # what its pods' volumes and environment read) goes through its network, as a real
        # kubelet's does, so cutting the node's link cuts that too.
        self.node_kube: dict[str, Kube] = {}
        self.writers: dict[str, StatusWriter] = {}
        self.log_servers: list[LogServer] = []
        self.gpu_pools: dict[str, GpuPool] = {}
        self._node_stops: dict[str, threading.Event] = {}
        """Set when the node is removed (``remove_node``) or the kubelet stops: its pod watch ends."""
        self._routable = False
        self._own_networks = False

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        routable = ensure_pod_network()
        # Nodes can have networks of their own only when they can reach the API server over
        # them: it listens on the bridge (``testcluster.kubelet.podnetwork.api_address``).
        self._routable = routable
        self._own_networks = routable and self.kube.host == HOST_ADDRESS
        for spec in self.config.nodes:
            self._register(spec)
        for name in list(self.writers):
            self._follow(name)

    def add_node(self, spec: NodeSpec) -> None:
        """A node joining the running cluster, as after a scale-out or a machine's replacement:
        registered, heartbeating, and running the pods bound to it."""
        with self._lock:
            if spec.name in self.agents:
                raise ValueError(f"{spec.name} is a node already")
        self._register(spec)
        self._follow(spec.name)

    def remove_node(self, name: str) -> None:
        """The node leaves for good: its pods' processes are killed, its Node object deleted, its
        network and addresses released (what ``add_node`` made)."""
        with self._lock:
            self._node_stops[name].set()
        self._kill_workers(name)
        self.writers.pop(name).stop()
        self.agents.pop(name).stop()
        try:
            self.kube.delete(f"/api/v1/nodes/{name}")
        except ApiError as error:
            if error.status != 404:
                raise
        self.addresses.pop(name).close()

    def _register(self, spec: NodeSpec) -> None:
        self.addresses[spec.name] = NodeAddresses(self._routable, own_network=self._own_networks, on_interface=True)
        node_ip = self.addresses[spec.name].node_ip
        kube = self.node_kube[spec.name] = self.kube.from_namespace(self.netns(spec.name))
        port = 0
        if self.config.serving_cert:
            cert, key = self.config.serving_cert
            with entered(self.netns(spec.name)):
                self.log_servers.append(LogServer(node_ip, cert, key, self._find).start())
            port = KUBELET_PORT
        agent = NodeAgent(kube, spec, node_ip, self.config.heartbeat, kubelet_port=port)
        agent.register()
        self.agents[spec.name] = agent
        self.gpu_pools[spec.name] = GpuPool(spec.name, int(spec.capacity.get(GPU_RESOURCE, "0")))
        self.writers[spec.name] = StatusWriter(kube, self._may_report)
        self._node_stops[spec.name] = threading.Event()
        (self.config.root / "nodes" / spec.name / "root").mkdir(parents=True, exist_ok=True)

    def _follow(self, name: str) -> None:
        self.writers[name].start()
        resource_version = self._first_listing(name)
        thread = threading.Thread(
            target=self._watch, args=(name, resource_version), daemon=True, name=f"kubelet-pod-watch-{name}"
        )
        thread.start()
        self._watch_threads.append(thread)

    def stop(self, grace: float = 2.0) -> None:
        """Stops every pod (SIGTERM, then SIGKILL after ``grace``) and the heartbeats."""
        self._stop.set()
        for node_stop in self._node_stops.values():
            node_stop.set()
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.terminate(grace)
        deadline = time.monotonic() + grace + 5
        for worker in workers:
            for runner in [*worker.runners, *worker.init_runners]:
                runner.finished.wait(max(0.0, deadline - time.monotonic()))
            worker.kill()
        for writer in self.writers.values():
            writer.stop()
        for agent in self.agents.values():
            agent.stop()
        for server in self.log_servers:
            server.stop()
        remove_created_mount_points()
        for addresses in self.addresses.values():
            addresses.close()

    # -- nodes -----------------------------------------------------------------------------------

    def node_root(self, node: str) -> Path:
        """The directory that plays the node's "/" for hostPath volumes."""
        return self.config.root / "nodes" / node / "root"

    def network(self, node: str) -> NodeNetwork:
        """The node's network namespace and link, where faults are made (``cut``, ``shape``,
        ``heal``); an error if the nodes share the host's network."""
        network = self.addresses[node].network
        if network is None:
            raise RuntimeError(
                f"{node} shares the host's network (not root, no iptables, or the API server on 127.0.0.1): "
                "network faults need nodes with networks of their own"
            )
        return network

    def cut(self, node: str, only_api: bool = False) -> None:
        """Cuts ``node`` off: from everything, or (``only_api``) from the API server alone."""
        if only_api:
            self.network(node).cut_from_api(self.api_port)
        else:
            self.network(node).cut()

    def heal(self, node: str) -> None:
        self.network(node).heal()

    def netns(self, node: str) -> str | None:
        """The node's network namespace, or None where nodes share the host's network."""
        network = self.addresses[node].network
        return network.namespace if network is not None else None

    def fail_node(self, node: str) -> None:
        """Simulates a dead node: heartbeats stop and its pods' processes are SIGKILLed at once.

        The pods stay bound in the API; the node lifecycle controller marks the node NotReady
        and the pods not ready after --node-monitor-grace-period, as with a real power loss.
        """
        with self._lock:
            self._failed_nodes.add(node)
            self.agents[node].fail()
        self._kill_workers(node)

    def _kill_workers(self, node: str) -> None:
        """SIGKILL every pod process on ``node`` at once (no grace, no hooks) and release its files."""
        with self._lock:
            doomed = [w for w in self.workers.values() if w.context.node_name == node]
            for worker in doomed:
                del self.workers[worker.uid]
                self.finished_workers.append(worker)
        for worker in doomed:
            worker.kill()
            worker.cleanup()

    def recover_node(self, node: str) -> None:
        """The node comes back: Ready again, and the pods still bound to it start afresh."""
        with self._lock:
            self._failed_nodes.discard(node)
        self.agents[node].recover()
        self._resync(node)

    # -- pods ------------------------------------------------------------------------------------

    def logs(self, namespace: str, pod: str, container: str | None = None, previous: bool = False) -> str:
        """The equivalent of ``kubectl logs [--previous]``; works after the pod is gone too."""
        worker = self._find(namespace, pod)
        if worker is None:
            raise KeyError(f"no pod {namespace}/{pod} ran on this kubelet")
        name = container or worker.pod["spec"]["containers"][0]["name"]
        path = worker.log_path(name, previous)
        return path.read_text(errors="replace") if path else ""

    def pod_worker(self, namespace: str, pod: str) -> PodWorker | None:
        return self._find(namespace, pod)

    def pods_in(self, namespace: str) -> list[PodWorker]:
        """Every pod of the namespace this kubelet ran or runs, oldest first."""
        with self._lock:
            return [w for w in [*self.finished_workers, *self.workers.values()] if w.namespace == namespace]

    def volume_dir(self, namespace: str, pod: str, volume: str) -> Path:
        """Where a pod's emptyDir/configMap/secret/projected volume lives on this machine, so a
        test can look inside a pod or change what it sees (e.g. flip a readiness file)."""
        worker = self._find(namespace, pod)
        if worker is None:
            raise KeyError(f"no pod {namespace}/{pod} ran on this kubelet")
        return worker.pod_dir / "volumes" / volume

    def pids(self) -> list[int]:
        """Process ids of every container process this kubelet started and has not reaped."""
        with self._lock:
            workers = [*self.workers.values(), *self.finished_workers]
        return [
            r.process.pid
            for w in workers
            for r in [*w.runners, *w.init_runners]
            if r.process is not None and r.process.poll() is None
        ]

    def _find(self, namespace: str, pod: str) -> PodWorker | None:
        with self._lock:
            candidates = [
                w
                for w in [*self.finished_workers, *self.workers.values()]
                if w.namespace == namespace and w.name == pod
            ]
        return candidates[-1] if candidates else None

    def _may_report(self, worker: PodWorker) -> bool:
        return worker.context.node_name not in self._failed_nodes and not self._stop.is_set()

    def _context(self, node: str) -> PodContext:
        base = {
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "HOME": os.environ.get("HOME", "/root"),
            **self.config.environment,
        }
        return PodContext(
            kube=self.node_kube[node],
            node_name=node,
            node_ip=self.addresses[node].node_ip,
            netns=self.netns(node),
            node_root=self.node_root(node),
            pods_root=self.config.root / "pods",
            api_host=self.kube.host,
            api_port=self.api_port,
            base_environment=base,
            isolated=self.isolated,
            backoff_base=self.config.backoff_base,
            backoff_cap=self.config.backoff_cap,
            submit_status=self.writers[node].submit,
            release_ip=self.addresses[node].release,
            gpus=self.gpu_pools[node],
        )

    def _first_listing(self, node: str, patience_s: float = 90.0) -> str:
        """The node's first listing, retried as its watch's relists are (reflector.follow): an API
        server too busy to answer within the request's timeout delays the node's start, for up to
        ``patience_s``, instead of ending the cluster."""
        deadline = time.monotonic() + patience_s
        while True:
            try:
                return self._resync(node)
            except Exception as error:  # noqa: BLE001 - what follow() retries; re-raised past the deadline
                if time.monotonic() >= deadline:
                    raise
                log.info("first pod listing of %s retried after %r", node, error)
                time.sleep(1.0)

    def _resync(self, node: str) -> str:
        """Lists the node's pods, as its kubelet does, and brings its workers in line."""
        listing = self.node_kube[node].get("/api/v1/pods", fieldSelector=f"spec.nodeName={node}")
        listed = {pod["metadata"]["uid"] for pod in listing.get("items", [])}
        with self._lock:
            # Pods deleted while no watch was open never send DELETED: stop them here.
            vanished = [w.pod for uid, w in self.workers.items() if w.context.node_name == node and uid not in listed]
        for pod in vanished:
            self._handle("DELETED", pod)
        for pod in listing.get("items", []):
            self._handle("ADDED", pod)
        return listing["metadata"]["resourceVersion"]

    def _watch(self, node: str, resource_version: str) -> None:
        follow(
            self.node_kube[node],
            "/api/v1/pods",
            relist=lambda: self._resync(node),
            on_event=self._handle,
            stopped=self._node_stops[node],
            what=f"pod watch of {node}",
            resource_version=resource_version,
            # A node cut off and healed finds out its stream is dead within this (+10 s).
            watch_seconds=15,
            fieldSelector=f"spec.nodeName={node}",
        )

    def _handle(self, kind: str, pod: Object) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if node not in self.agents or self._node_stops[node].is_set():
            return
        uid = pod["metadata"]["uid"]
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        with self._lock:
            if node in self._failed_nodes or self._stop.is_set():
                return
            worker = self.workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    del self.workers[uid]
                    self.finished_workers.append(worker)
                    worker.kill()
                    worker.cleanup()
                return
            if pod["metadata"].get("deletionTimestamp"):
                if worker is None:
                    threading.Thread(
                        target=delete_pod_object, args=(self.node_kube[node], namespace, name, uid), daemon=True
                    ).start()
                elif not worker.terminating:
                    worker.pod = pod
                    grace = float(pod["metadata"].get("deletionGracePeriodSeconds", 30))

                    def remove(worker: PodWorker = worker) -> None:
                        delete_pod_object(self.node_kube[node], worker.namespace, worker.name, worker.uid)

                    worker.terminate(grace, then=remove)
                return
            if worker is not None:
                worker.update(pod)
                return
            if pod.get("status", {}).get("phase") in TERMINAL_PHASES:
                return
            address = self.addresses[node].allocate(pod.get("status", {}).get("podIP"))
            worker = PodWorker(pod, address, self._context(node))
            self.workers[uid] = worker
        worker.start()
