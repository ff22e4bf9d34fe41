"""One pod on one node: volumes, init containers, containers, status, graceful deletion."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..rest import ApiError, Kube, Object
from . import termination
from .containers import Backoff, ContainerRunner, LaunchSpec, resolve_argv
from .devices import GpuPool, gpus_requested
from .environment import MissingReference, container_environment
from .nodes import now_rfc3339
from .processes import Mount
from .volumes import REFRESHED, VolumeNotReady, prepare_volumes, refresh_volumes

log = logging.getLogger(__name__)

# Conditions this kubelet owns; all others (PodScheduled, readiness gates, DisruptionTarget)
# belong to someone else and survive our patches because conditions merge by type.
OWNED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


VOLUME_SYNC_S = 2.0
"""How often a running pod's configMap and secret volumes are brought in line with their objects
(a kubelet's sync period, compressed as the back-off is)."""


@dataclass
class PodContext:
    """What the kubelet lends each pod worker."""

    kube: Kube
    node_name: str
    node_ip: str
    netns: str | None
    node_root: Path
    pods_root: Path
    api_host: str
    api_port: int
    base_environment: dict[str, str]
    isolated: bool
    backoff_base: float
    backoff_cap: float
    submit_status: Callable[[PodWorker], None]
    release_ip: Callable[[str], None]
    gpus: GpuPool


class PodWorker:
    def __init__(self, pod: Object, pod_ip: str, context: PodContext) -> None:
        self.pod = pod
        self.context = context
        metadata = pod["metadata"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        self.uid: str = metadata["uid"]
        self.host_network = bool(pod["spec"].get("hostNetwork"))
        self.pod_ip = context.node_ip if self.host_network else pod_ip
        self._allocated_ip = pod_ip
        self.pod_dir = context.pods_root / f"{self.namespace}_{self.name}_{self.uid}"
        self.restart_policy: str = pod["spec"].get("restartPolicy", "Always")
        self.init_runners: list[ContainerRunner] = []
        self.runners: list[ContainerRunner] = []
        self.start_time = now_rfc3339()
        self.initialized = False
        self.volumes_ready = False
        self.failed_reason: str | None = None
        self.terminating = False
        self.finished = threading.Event()
        self._transitions: dict[str, tuple[str, str]] = {}
        self.gpus: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"pod-{self.name}")

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def update(self, pod: Object) -> None:
        """A newer version of the pod arrived (readiness gate flipped, labels changed)."""
        self.pod = pod
        self.context.submit_status(self)

    def _run(self) -> None:
        try:
            volumes = self._prepare_volumes()
            if volumes is None:
                return
            self.volumes_ready = True
            if any(kind in volume for volume in self.pod["spec"].get("volumes") or [] for kind in REFRESHED):
                threading.Thread(target=self._refresh_volumes, daemon=True, name=f"volumes-{self.name}").start()
            specs = self.pod["spec"]
            init_specs = specs.get("initContainers", []) or []
            self.init_runners = [self._runner(spec, volumes, init=True) for spec in init_specs]
            self.runners = [self._runner(spec, volumes, init=False) for spec in specs["containers"]]
            self.context.submit_status(self)
            for runner in self.init_runners:
                if self.terminating:
                    return
                if runner.spec.get("restartPolicy") == "Always":
                    threading.Thread(target=runner.run, daemon=True, name=f"sidecar-{runner.name}").start()
                    continue
                exit_code = runner.run()
                if self.terminating:
                    return
                if exit_code != 0:
                    self.failed_reason = f"init container {runner.name} exited {exit_code}"
                    self.context.submit_status(self)
                    return
            if self.terminating:
                return
            self.initialized = True
            self.context.submit_status(self)
            threads = [threading.Thread(target=r.run, daemon=True, name=f"container-{r.name}") for r in self.runners]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            self.context.submit_status(self)
        except Exception:  # noqa: BLE001 - a broken pod must not take the kubelet down
            log.exception("pod %s/%s failed", self.namespace, self.name)
            self.failed_reason = "kubelet error, see the test log"
            self.context.submit_status(self)
        finally:
            self.finished.set()

    def _prepare_volumes(self) -> dict[str, Path] | None:
        while not self.terminating:
            try:
                return prepare_volumes(self.context.kube, self.pod, self.pod_dir, self.context.node_root)
            except VolumeNotReady as waiting:
                log.debug("pod %s/%s: %s", self.namespace, self.name, waiting)
                time.sleep(0.5)
        return None

    def _refresh_volumes(self) -> None:
        while not self.terminating and not self.finished.wait(VOLUME_SYNC_S):
            try:
                refresh_volumes(self.context.kube, self.pod, self.pod_dir)
            except Exception as error:  # noqa: BLE001 - the API unreachable, an object gone: next round
                log.debug("pod %s/%s: volumes not refreshed: %s", self.namespace, self.name, error)

    def _hosts_file(self, hostname: str) -> Path:
        hosts = self.pod_dir / "etc-hosts"
        if not hosts.exists():
            hosts.parent.mkdir(parents=True, exist_ok=True)
            hosts.write_text(
                "# Kubernetes-managed hosts file (the process kubelet).\n"
                "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
                f"{self.pod_ip}\t{hostname}\n"
            )
        return hosts

    def _runner(self, spec: Object, volumes: dict[str, Path], *, init: bool) -> ContainerRunner:
        mounts = [
            Mount(
                volumes[m["name"]] / m["subPath"] if m.get("subPath") else volumes[m["name"]],
                m["mountPath"],
                bool(m.get("readOnly")),
            )
            for m in spec.get("volumeMounts", []) or []
        ]
        hostname = None
        if not self.host_network:
            # As a real kubelet does: the pod's hostname is its name (or spec.hostname) and its
            # /etc/hosts says that name is the pod's IP, so a process that advertises its own
            # address by hostname (gloo's rendezvous does) gives one its peers can reach.
            hostname = (self.pod["spec"].get("hostname") or self.name)[:63]
            mounts.append(Mount(self._hosts_file(hostname), "/etc/hosts", read_only=True))
        launch = LaunchSpec(
            argv=[],
            environment={},
            working_dir=spec.get("workingDir"),
            mounts=mounts,
            log_dir=self.pod_dir / "logs" / spec["name"],
            pod_ip=self.pod_ip,
            isolated=self.context.isolated,
            netns=self.context.netns,
            hostname=hostname,
            termination_dir=self.pod_dir / "containers" / spec["name"],
            message_limit=termination.budget(self.pod["spec"]),
        )
        # A sidecar (an init container with restartPolicy Always) restarts like a regular
        # container of an Always pod, whatever the pod's own policy.
        sidecar = init and spec.get("restartPolicy") == "Always"
        runner = ContainerRunner(
            spec,
            launch,
            restart_policy="Always" if sidecar else self.restart_policy,
            init=init and not sidecar,
            backoff=Backoff(self.context.backoff_base, self.context.backoff_cap),
            on_change=lambda: self.context.submit_status(self),
            termination_grace=float(self.pod["spec"].get("terminationGracePeriodSeconds", 30)),
        )
        self._resolve_launch(runner)
        return runner

    def _resolve_launch(self, runner: ContainerRunner) -> None:
        # Resolved when the container is created, like the real kubelet: a later ConfigMap
        # change does not reach a running container's environment.
        while True:
            try:
                pod = {
                    **self.pod,
                    "status": {
                        **self.pod.get("status", {}),
                        "podIP": self.pod_ip,
                        "podIPs": [{"ip": self.pod_ip}],
                        "hostIP": self.context.node_ip,
                        "hostIPs": [{"ip": self.context.node_ip}],
                    },
                }
                environment = container_environment(
                    self.context.kube,
                    pod,
                    runner.spec,
                    self.context.base_environment,
                    self.context.api_host,
                    self.context.api_port,
                )
                break
            except MissingReference as missing:
                runner.state = {"waiting": {"reason": "CreateContainerConfigError", "message": str(missing)}}
                self.context.submit_status(self)
                if self.terminating:
                    return
                time.sleep(0.5)
        wanted = gpus_requested(runner.spec)
        if wanted:
            assigned = self.context.gpus.allocate(wanted)
            self.gpus.extend(assigned)
            environment["NVIDIA_VISIBLE_DEVICES"] = ",".join(assigned)
        runner.launch.environment = environment
        runner.launch.argv = resolve_argv(runner.spec, environment)

    def terminate(self, grace: float, then: Callable[[], None] | None = None) -> None:
        """Graceful deletion in the background: SIGTERM, wait up to ``grace``, SIGKILL, then ``then``."""
        self.terminating = True

        def stop_all() -> None:
            runners = [*self.runners, *self.init_runners]
            stoppers = [threading.Thread(target=r.stop, args=(grace,), daemon=True) for r in runners]
            for stopper in stoppers:
                stopper.start()
            for stopper in stoppers:
                stopper.join()
            for runner in runners:
                runner.finished.wait(5)  # set at once for a container that never ran (stop())
            self.context.submit_status(self)
            if then is not None:
                then()

        threading.Thread(target=stop_all, daemon=True, name=f"terminate-{self.name}").start()

    def kill(self) -> None:
        """Immediate SIGKILL of every container (node failure); no status is reported."""
        self.terminating = True
        for runner in [*self.runners, *self.init_runners]:
            runner.kill()

    def cleanup(self, keep_logs: bool = True) -> None:
        self.context.release_ip(self._allocated_ip)
        self.context.gpus.release(self.gpus)
        self.gpus = []
        volumes = self.pod_dir / "volumes"
        if volumes.exists():
            shutil.rmtree(volumes, ignore_errors=True)

    def log_path(self, container: str, previous: bool = False) -> Path | None:
        runner = next((r for r in [*self.runners, *self.init_runners] if r.name == container), None)
        restart = runner.restart_count if runner else 0
        if previous:
            restart -= 1
        path = self.pod_dir / "logs" / container / f"{restart}.log"
        if not path.exists() and runner is not None and not previous:
            earlier = sorted((self.pod_dir / "logs" / container).glob("*.log"), key=lambda p: int(p.stem))
            return earlier[-1] if earlier else None
        return path if path.exists() else None

    # -- status ----------------------------------------------------------------------------------

    def status_patch(self) -> dict[str, Any]:
        container_statuses = [r.status() for r in self.runners] or [
            _waiting_status(c) for c in self.pod["spec"]["containers"]
        ]
        init_statuses = [r.status() for r in self.init_runners] or [
            _waiting_status(c) for c in self.pod["spec"].get("initContainers", []) or []
        ]
        containers_ready = bool(self.runners) and all(r.ready for r in self.runners) and not self.terminating
        gates = [g["conditionType"] for g in self.pod["spec"].get("readinessGates", []) or []]
        observed = {c["type"]: c.get("status") for c in self.pod.get("status", {}).get("conditions", []) or []}
        gates_pass = all(observed.get(gate) == "True" for gate in gates)
        ready = containers_ready and gates_pass
        phase = self._phase()
        if phase in ("Succeeded", "Failed"):
            ready = containers_ready = False
        conditions = [
            self._condition("PodReadyToStartContainers", self.volumes_ready),
            self._condition("Initialized", self.initialized),
            self._condition("ContainersReady", containers_ready),
            self._condition("Ready", ready, None if gates_pass or not containers_ready else "ReadinessGatesNotReady"),
        ]
        status: dict[str, Any] = {
            "phase": phase,
            "conditions": conditions,
            "hostIP": self.context.node_ip,
            "hostIPs": [{"ip": self.context.node_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "containerStatuses": container_statuses,
        }
        if init_statuses:
            status["initContainerStatuses"] = init_statuses
        if self.failed_reason:
            status["message"] = self.failed_reason
        return status

    def _phase(self) -> str:
        if self.failed_reason:
            return "Failed"
        if not self.initialized:
            return "Pending"
        runners = self.runners
        if not all(r.finished.is_set() for r in runners):
            return "Running"
        codes = [r.state.get("terminated", {}).get("exitCode", 1) for r in runners]
        return "Succeeded" if all(code == 0 for code in codes) else "Failed"

    def _condition(self, kind: str, value: bool, reason: str | None = None) -> dict[str, str]:
        status = "True" if value else "False"
        with self._lock:
            previous = self._transitions.get(kind)
            if previous is None or previous[0] != status:
                self._transitions[kind] = (status, now_rfc3339())
            stamp = self._transitions[kind][1]
        condition = {"type": kind, "status": status, "lastTransitionTime": stamp, "lastProbeTime": None}
        if reason:
            condition["reason"] = reason
        return condition


def _waiting_status(spec: Object) -> dict[str, Any]:
    return {
        "name": spec["name"],
        "image": spec.get("image", ""),
        "imageID": "",
        "ready": False,
        "started": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "PodInitializing"}},
    }


def delete_pod_object(kube: Kube, namespace: str, name: str, uid: str, attempts: int = 60) -> None:
    """What the real kubelet does once the containers are gone: delete with grace 0, guarded
    by the uid so a pod recreated under the same name is never removed by mistake. Retried
    until the API server answers, as the kubelet's status manager does on every sync: a pod
    whose removal was lost to a slow or busy API server would otherwise stay Terminating for
    good (the kubelet acts on a pod's deletion once)."""
    for attempt in range(attempts):
        try:
            kube.delete(
                f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
            )
            return
        except ApiError as error:
            if error.status in (404, 409):
                return
            failure: Exception = error
        except Exception as error:  # noqa: BLE001 - connection errors and timeouts: try again
            failure = error
        log.warning("removing pod %s/%s failed (attempt %d): %s", namespace, name, attempt + 1, failure)
        time.sleep(1)
    log.error("gave up removing pod %s/%s after %d attempts", namespace, name, attempts)
