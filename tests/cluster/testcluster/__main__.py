"""``python -m testcluster``: the e2e cluster for a person at a terminal. Run from tests/cluster
(or with it on PYTHONPATH); as root, like the tests.

- ``up``: starts the control plane and a process kubelet like the pytest fixtures do, prints how
  to reach them, and tears everything down on Ctrl-C. ``up --detach`` returns once the nodes are
  Ready and leaves the cluster running in the background (default directory
  /tmp/weightcache-cluster); ``down`` stops it.
- ``sample``: on a detached cluster, what ``make cluster`` adds: the operator installed with helm,
  the nodes labelled and the checkpoint placed for examples/weightcache-cpu.yaml.
- ``demo``: the operator's main job, narrated, on a fresh detached cluster (``make demo``;
  ``--engine vllm``: on examples/weightcache-vllm-cpu.yaml, ``make demo ENGINE=vllm``; ``--engine
  sglang``: on examples/weightcache-sglang-cpu.yaml, ``make demo ENGINE=sglang``, which runs it in
  the SGLang test environment).
- ``fault NODE cut|cut-api|slow|heal|show``: network faults on a detached cluster's node (its
  network namespace): ``cut`` drops all its traffic but loopback, ``cut-api`` only its traffic
  with the API server, ``slow --rate-kbit R --loss P`` limits and thins its link, ``heal``
  removes them all, ``show`` lists what is in place (``testcluster.kubelet.nodenetwork``).
- ``which helm|kubectl`` prints the path of the unpacked tool (unpacking it once), for the
  Makefile's ``manifests`` target; it starts nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from .binaries import client_tools
from .kubelet.nodenetwork import NodeNetworkError
from .local import DEFAULT_DIR, LocalClusterError, running, serve, start_detached, stop

FAULTS = ("cut", "cut-api", "slow", "heal", "show")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m testcluster")
    parser.add_argument("command", choices=["up", "down", "sample", "demo", "which", "fault"])
    parser.add_argument("words", nargs="*", help="which: helm or kubectl; fault: NODE and cut|cut-api|slow|heal|show")
    parser.add_argument("--rate-kbit", type=int, default=None, help="fault slow: the link's rate each way")
    parser.add_argument("--loss", type=float, default=0.0, help="fault slow: the share of packets dropped each way")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--dir",
        type=Path,
        default=None,
        help=f"state directory (default: {DEFAULT_DIR} for --detach, down, sample and demo; "
        "a new temp dir for a foreground up)",
    )
    parser.add_argument("--detach", action="store_true", help="up: leave the cluster running in the background")
    parser.add_argument("--node-grace", type=float, default=6.0, help="seconds until a silent node is NotReady")
    parser.add_argument("--keep", action="store_true", help="demo: leave the cluster running at the end")
    parser.add_argument(
        "--engine",
        choices=["reference", "vllm", "sglang"],
        default="reference",
        help="demo: the engines to run: the reference engine (examples/weightcache-cpu.yaml), "
        "vLLM (examples/weightcache-vllm-cpu.yaml) or SGLang (examples/weightcache-sglang-cpu.yaml)",
    )
    parser.add_argument("--report", type=Path, default=None, help="demo: also write what it measured as JSON here")
    options = parser.parse_args()
    # Progress lines must show as they happen when the output is a pipe (make, CI logs) too.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if options.command == "which":
        if options.words not in (["helm"], ["kubectl"]):
            parser.error("which: name the tool, helm or kubectl")
        print(getattr(client_tools(), options.words[0]))
        return 0
    if options.command == "fault" and (len(options.words) != 2 or options.words[1] not in FAULTS):
        parser.error(f"fault: name the node and one of {', '.join(FAULTS)}, e.g. fault node-1 cut")
    directory = options.dir or DEFAULT_DIR
    try:
        if options.command == "up" and not options.detach:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
            serve(
                options.dir or Path(tempfile.mkdtemp(prefix="weightcache-cluster-")), options.nodes, options.node_grace
            )
        elif options.command == "up":
            cluster = start_detached(directory, options.nodes)
            print(f"local cluster running (pid {cluster.pid}), state in {cluster.dir}\n{cluster.shell_setup()}")
        elif options.command == "down":
            if running(directory) is None:
                stop(directory)  # what a crashed one left behind
                print(f"no local cluster running from {directory}")
            else:
                left = stop(directory)
                print(f"local cluster stopped, {directory} removed" + (f"; killed leftovers: {left}" if left else ""))
        elif options.command == "sample":
            from .demo import prepare_sample

            cluster = running(directory)
            if cluster is None:
                raise LocalClusterError(
                    f"no local cluster running from {directory}: start one with "
                    f"python -m testcluster up --detach --dir {directory}"
                )
            prepare_sample(cluster)
            print(
                f"The operator is installed and the nodes are ready for the sample. In a shell:\n{cluster.shell_setup()}\n"
                "kubectl apply -f examples/weightcache-cpu.yaml && kubectl get wc -w   (README: Try it locally, step 4)"
            )
        elif options.command == "fault":
            cluster = running(directory)
            if cluster is None:
                raise LocalClusterError(f"no local cluster running from {directory}: start one with make cluster")
            node, fault = options.words
            network = cluster.network(node)
            if fault == "cut":
                network.cut()
            elif fault == "cut-api":
                network.cut_from_api(cluster.api_port)
            elif fault == "slow":
                if options.rate_kbit is None and not options.loss:
                    parser.error("fault slow: give --rate-kbit, --loss or both")
                network.shape(options.rate_kbit, options.loss)
            elif fault == "heal":
                network.heal()
            print("\n".join(network.faults()) or f"{node}: no faults")
        else:
            from .demo import run_demo

            return run_demo(directory, keep=options.keep, report_path=options.report, engine=options.engine)
    except (LocalClusterError, NodeNetworkError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
