"""The cluster the CPU benchmarks run on: the real control plane and the process kubelet (2 nodes
labelled for examples/weightcache-cpu.yaml, its checkpoint on both "disks"), the CRDs and the
peering object from deploy/operator.yaml, and the operator as a process — what the e2e tests
start, as one context manager so each benchmark only says what it measures.

Needs the e2e cluster build (tests/cluster/build.sh, cached) and root, like the e2e tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from testcluster.binaries import client_tools, control_plane_binary
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import KubeletConfig, ProcessKubelet
from testcluster.kubelet.nodes import NodeSpec
from testcluster.rest import ApiError, Kube
from testcluster.sample import (
    DAEMONS,
    ENGINES,
    REPO,
    SAMPLE,
    daemon_facts,
    generate_checkpoint,
    node_labels,
    place_checkpoint,
    pods,
    sample,
)
from testcluster.strays import MARKER, new_session_id
from testcluster.waiting import wait_for

__all__ = ["DAEMONS", "ENGINES", "NS", "WC", "SampleCluster", "print_table", "sample", "sample_cluster"]

NS = "bench"
WC = f"/apis/weightcache.io/v1alpha1/namespaces/{NS}/weightcaches/tiny-llama"
NODES = ("node-1", "node-2")


@dataclass
class SampleCluster:
    work: Path
    plane: ControlPlane
    kube: Kube
    kubelet: ProcessKubelet
    operator: subprocess.Popen[bytes]

    def apply(self, body: dict[str, Any]) -> None:
        self.plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(body))

    def status(self) -> dict[str, Any]:
        return self.kube.get(WC).get("status") or {}

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return pods(self.kube, NS, selector)

    def daemon_facts(self) -> dict[str, tuple[str, int, int]]:
        """Daemon pod → (uid, container restarts, checkpoint bytes its ranks read)."""
        return daemon_facts(self.kube, NS)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def sample_cluster(
    prefix: str,
    operator_env: dict[str, str] | None = None,
    node_monitor_grace_period: float = 6.0,
    nodes: int = len(NODES),
    example: Path = SAMPLE,
) -> Iterator[SampleCluster]:
    """Starts everything (on the first ``nodes`` of ``NODES``, labelled and with the checkpoint of
    ``example``), yields it, and stops it all (operator, kubelet with its pods, control plane)
    however the benchmark ends."""
    control_plane_binary()
    client_tools()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    session = new_session_id()
    plane = ControlPlane(
        work / "cluster", node_monitor_grace_period=node_monitor_grace_period, environment={MARKER: session}
    )
    plane.start()
    kube = Kube.from_kubeconfig(plane.kubeconfig)
    names = NODES[:nodes]
    specs = [NodeSpec(name, labels=node_labels(example)) for name in names]
    kubelet = ProcessKubelet(
        kube,
        plane.port,
        KubeletConfig(
            root=work / "kubelet",
            nodes=specs,
            serving_cert=plane.kubelet_serving_cert,
            environment={
                MARKER: session,
                "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("contract", "daemon_image")),
            },
        ),
    )
    operator: subprocess.Popen[bytes] | None = None
    try:
        kubelet.start()
        _install(plane, kube)
        made = generate_checkpoint(work / "checkpoint", example)
        place_checkpoint(made, [kubelet.node_root(node) for node in names], example)
        env = {
            **os.environ,
            "KUBECONFIG": str(plane.kubeconfig),
            MARKER: session,
            "WEIGHTCACHE_OPERATOR_RESYNC_SECONDS": "5",
            "WEIGHTCACHE_OPERATOR_METRICS": f"127.0.0.1:{free_port()}",
            "WEIGHTCACHE_OPERATOR_HEALTH": f"127.0.0.1:{free_port()}",
            **(operator_env or {}),
        }
        operator = subprocess.Popen(
            [sys.executable, "-m", "weightcache_operator"],
            env=env,
            stdout=(work / "operator.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        yield SampleCluster(work, plane, kube, kubelet, operator)
    finally:
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            operator.wait(timeout=30)
        kubelet.stop()
        plane.stop()


def _install(plane: ControlPlane, kube: Kube) -> None:
    """CRDs, the peering object the operator waits for (it ships in deploy/operator.yaml) and the
    benchmark's namespace."""
    from weightcache_operator.crd import custom_resource_definition, render

    plane.kubectl("apply", "--server-side", "-f", "-", input=render())
    plane.kubectl("wait", "--for=condition=Established", f"crd/{custom_resource_definition()['metadata']['name']}")
    plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "kopf-peering.yaml"))
    plane.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev")
    deployed = yaml.safe_load_all((REPO / "deploy" / "operator.yaml").read_text())
    peering = next(d for d in deployed if d and d["kind"] == "ClusterKopfPeering")
    plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(peering))
    # Right after a CRD is Established its storage may still answer 429; kopf's peering start-up
    # does not always recover from that, so wait until both kinds list.
    wait_for(
        lambda: (
            _lists(kube, "/apis/kopf.dev/v1/clusterkopfpeerings")
            and _lists(kube, "/apis/weightcache.io/v1alpha1/weightcaches")
        ),
        60,
    )
    kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    wait_for(lambda: kube.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default"), 30)


def _lists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
        return True
    except ApiError:
        return False


def print_table(rows: list[tuple[str, str]]) -> None:
    width = max(len(r[0]) for r in rows)
    print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
    for name, value in rows:
        print(f"| {name:<{width}} | {value} |")
