"""A local cluster that outlives the command that started it (``make cluster``, ``make demo KEEP=1``).

``start_detached`` builds or finds the control plane (reporting progress on a cold build), then
runs ``python -m testcluster up --dir D`` in a session of its own: that process holds the control
plane and the process kubelet, and writes ``D/local.json`` once every node is Ready. The command
that started it returns; ``stop`` ends it (SIGTERM: the kubelet stops every pod, then the control
plane stops), checks by the environment marker that no process of it is left, and removes ``D``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .binaries import CLUSTER_SOURCES, client_tools, control_plane_binary
from .controlplane import ControlPlane
from .kubelet import KubeletConfig, ProcessKubelet
from .kubelet.nodenetwork import NodeNetwork
from .kubelet.nodes import NodeSpec
from .rest import Kube
from .strays import MARKER, kill_all, marked_processes, new_session_id
from .waiting import wait_for

# One local cluster per machine by default: /tmp because a cluster does not survive a reboot either.
DEFAULT_DIR = Path("/tmp/weightcache-cluster")
INFO = "local.json"
REPO = CLUSTER_SOURCES.parent.parent


class LocalClusterError(RuntimeError):
    """The local cluster could not be started or is in the way; the message says what to do."""


@dataclass(frozen=True)
class LocalCluster:
    """What ``D/local.json`` records: how to reach a running local cluster."""

    dir: str
    pid: int
    session: str
    server: str
    kubeconfig: str
    kubectl: str
    helm: str
    nodes: list[str]
    networks: dict[str, str] = field(default_factory=dict)
    """Each node's network namespace (none where nodes share the host's network)."""

    def network(self, node: str) -> NodeNetwork:
        """Where faults are made on ``node`` (``python -m testcluster fault``)."""
        if node not in self.nodes:
            raise LocalClusterError(f"no node {node} in this cluster; its nodes: {', '.join(self.nodes)}")
        if node not in self.networks:
            raise LocalClusterError(
                f"{node} shares the host's network (not root, no iptables, or the API server on 127.0.0.1): "
                "network faults need nodes with networks of their own"
            )
        return NodeNetwork.of_namespace(self.networks[node])

    @property
    def api_port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    def node_root(self, node: str) -> Path:
        """The directory that plays the node's "/" for hostPath volumes."""
        return Path(self.dir) / "kubelet" / "nodes" / node / "root"

    def kube(self) -> Kube:
        return Kube.from_kubeconfig(Path(self.kubeconfig))

    def shell_setup(self) -> str:
        """The two lines that make ``kubectl`` and ``helm`` in a shell talk to this cluster."""
        return f"export KUBECONFIG={self.kubeconfig}\nexport PATH={Path(self.kubectl).parent}:$PATH"


def running(directory: Path = DEFAULT_DIR) -> LocalCluster | None:
    """The cluster recorded in ``directory`` if its process is alive."""
    try:
        cluster = LocalCluster(**json.loads((directory / INFO).read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return cluster if _alive(cluster.pid, cluster.session) else None


def start_detached(
    directory: Path = DEFAULT_DIR,
    nodes: int = 2,
    timeout: float = 120.0,
    say: Callable[[str], None] = print,
    log: Path | None = None,
) -> LocalCluster:
    """Starts a cluster in ``directory`` that keeps running after this process exits. Its process
    (the process kubelet among it) writes to ``log``, ``directory/up.log`` unless given: the demo
    keeps it outside ``directory``, which a failed start removes."""
    if os.geteuid() != 0:
        raise LocalClusterError(
            "the local cluster needs root: each node is a network namespace on a bridge (`ip netns`, veth) whose "
            "pods get IPs from 198.18.0.0/16, and pods see their volumes through mounts in private mount "
            "namespaces; run it as root (sudo make ...)"
        )
    if (existing := running(directory)) is not None:
        raise LocalClusterError(
            f"a local cluster is already running from {directory} (pid {existing.pid}); "
            f"use it, or stop it first: make cluster-down (python -m testcluster down --dir {directory})"
        )
    started = time.monotonic()
    binary = control_plane_binary(progress=say)
    tools = client_tools()
    say(
        f"control plane binary {binary} ({time.monotonic() - started:.1f}s); kubectl and helm in {tools.kubectl.parent}"
    )
    _remove(directory)
    directory.mkdir(parents=True)
    log = log or directory / "up.log"
    session = new_session_id()
    environment = {
        **os.environ,
        MARKER: session,
        "PYTHONPATH": os.pathsep.join([str(CLUSTER_SOURCES), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "testcluster", "up", "--dir", str(directory), "--nodes", str(nodes)],
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=environment,
            start_new_session=True,
        )
    # Reaped by a thread, so a stop() from this process sees the exit instead of a zombie.
    threading.Thread(target=process.wait, daemon=True, name="local-cluster-reaper").start()
    try:
        return wait_for(lambda: _ready_or_raise(directory, process, log), timeout, interval=0.2)
    except BaseException:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        kill_all(marked_processes(session))
        _remove(directory)
        raise


def _ready_or_raise(directory: Path, process: subprocess.Popen[bytes], log: Path) -> LocalCluster | None:
    if process.poll() is not None:
        tail = log.read_text(errors="replace")[-3000:]
        raise LocalClusterError(f"the local cluster exited with {process.returncode}:\n{tail}")
    return running(directory)


def stop(directory: Path = DEFAULT_DIR, timeout: float = 60.0, keep_logs: Path | None = None) -> dict[int, str]:
    """Stops the cluster recorded in ``directory`` and removes the directory, first copying its
    logs to ``keep_logs`` if given (``copy_logs``). Returns the processes that were still alive
    after a clean stop and had to be killed (none, normally)."""
    try:
        cluster = LocalCluster(**json.loads((directory / INFO).read_text()))
    except (OSError, ValueError, TypeError):
        cluster = None
    leftovers: dict[int, str] = {}
    if cluster is not None:
        if _alive(cluster.pid, cluster.session):
            os.kill(cluster.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(cluster.pid, cluster.session) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(cluster.pid, cluster.session):
                os.kill(cluster.pid, signal.SIGKILL)
        # Components and containers die with their parents within milliseconds; give them that long.
        deadline = time.monotonic() + 10
        while (leftovers := marked_processes(cluster.session)) and time.monotonic() < deadline:
            time.sleep(0.1)
        kill_all(leftovers)
    if keep_logs is not None:
        copy_logs(directory, keep_logs)
    _remove(directory)
    return leftovers


def pod_log(directory: Path, namespace: str, name: str, uid: str, container: str) -> list[Path]:
    """A container's log files in a cluster's ``directory``, one per run (restart), oldest first:
    the files the process kubelet writes the container's output to and ``kubectl logs`` reads."""
    logs = directory / "kubelet" / "pods" / f"{namespace}_{name}_{uid}" / "logs" / container
    return sorted(logs.glob("*.log"), key=lambda p: int(p.stem) if p.stem.isdigit() else -1)


def kept_log(log: Path, directory: Path, target: Path) -> Path:
    """Where ``copy_logs(directory, target)`` puts ``log``, a log file in ``directory``."""
    parts = log.relative_to(directory).parts
    if parts[:2] == ("kubelet", "pods"):
        namespace, name, _uid = parts[2].split("_")
        return target.joinpath("pods", namespace, name, *parts[4:])
    if parts[:1] == ("cluster",):
        return target.joinpath("control-plane", *parts[1:])
    return target.joinpath(*parts)


def copy_logs(directory: Path, target: Path) -> list[Path]:
    """Copies a stopped cluster's logs out of ``directory``: the control plane's (``cluster/up.log``,
    ``cluster/logs/``) to ``target/control-plane/`` and every container's output to
    ``target/pods/<namespace>/<pod>/<container>/<restart>.log``. Returns the copies."""
    logs = [
        *(directory / "cluster").glob("up.log"),
        *(directory / "cluster" / "logs").glob("*.log"),
        *(directory / "kubelet" / "pods").glob("*/logs/*/*.log"),
    ]
    copies = []
    for log in logs:
        copy = kept_log(log, directory, target)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, copy)
        copies.append(copy)
    return copies


def serve(directory: Path, nodes: int, node_grace: float) -> None:
    """The body of ``python -m testcluster up``: runs the control plane and the process kubelet
    until SIGINT or SIGTERM, with every process it starts marked for ``stop``'s check."""
    stopping = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    session = os.environ.get(MARKER) or new_session_id()
    plane = ControlPlane(directory / "cluster", node_monitor_grace_period=node_grace, environment={MARKER: session})
    plane.start()
    names = [f"node-{i + 1}" for i in range(nodes)]
    kube = Kube.from_kubeconfig(plane.kubeconfig)
    kubelet = ProcessKubelet(
        kube,
        plane.port,
        KubeletConfig(
            root=directory / "kubelet",
            nodes=[NodeSpec(name) for name in names],
            serving_cert=plane.kubelet_serving_cert,
            # Pods run this checkout's code (`python -m weightcache`, `python -m weightcache_operator`),
            # as the images have both packages installed.
            environment={
                MARKER: session,
                "PYTHONPATH": os.pathsep.join(str(REPO / part) for part in ("contract", "daemon_image", "operator")),
            },
        ),
    )
    try:
        kubelet.start()
        wait_for(lambda: all(_node_ready(kube, name) for name in names), 60, describe="nodes never turned Ready")
        cluster = LocalCluster(
            str(directory),
            os.getpid(),
            session,
            plane.server,
            str(plane.kubeconfig),
            str(plane.tools.kubectl),
            str(plane.tools.helm),
            names,
            {name: ns for name in names if (ns := kubelet.netns(name)) is not None},
        )
        partial = directory / f"{INFO}.partial"
        partial.write_text(json.dumps(asdict(cluster)))
        os.replace(partial, directory / INFO)
        print(f"control plane up in {plane.start_seconds:.1f}s at {plane.server}", flush=True)
        print(cluster.shell_setup(), flush=True)
        print(
            f"node roots (hostPath): {directory / 'kubelet' / 'nodes'}/<node>/root   Ctrl-C stops everything",
            flush=True,
        )
        stopping.wait()
    finally:
        kubelet.stop()
        plane.stop()


def _node_ready(kube: Kube, name: str) -> bool:
    conditions = kube.get(f"/api/v1/nodes/{name}")["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _alive(pid: int, session: str | None = None) -> bool:
    """Whether ``pid`` runs (a zombie does not) and, given ``session``, is the cluster process that
    carries its marker (not another process that got a recycled pid after a reboot or a crash)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        environment = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if session else []
    except (OSError, IndexError):
        return False
    return state != "Z" and (session is None or f"{MARKER}={session}".encode() in environment)


def _remove(directory: Path) -> None:
    """Removes a stopped cluster's directory (node roots with their checkpoints, logs, certificates)."""
    shutil.rmtree(directory, ignore_errors=True)
