"""Rolling engine upgrade benchmark: 2 replicas (each with a hot standby) under steady load through
the Service, on the real control plane with the process kubelet (2 nodes, cpu-shm, the reference
engine), the operator running as a process.

It applies examples/weightcache-cpu.yaml with 2 replicas, waits until it is Ready, starts one
client that sends completions back to back through a kube-proxy-like proxy (retrying a failed
request once), changes the engine template (an env variable) and waits for the rollout to
complete. It prints failed requests, the checkpoint bytes the daemons read during the rollout
(their own disk_bytes_read counters), daemon restarts, total time and the time per replica
(from status.rollout.updated). A script, not a test: it prints a table and asserts nothing.

    PYTHONPATH=daemon_image:operator:tests/cluster .venv/bin/python benchmarks/rolling_upgrade.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from testcluster.binaries import client_tools, control_plane_binary
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import KubeletConfig, ProcessKubelet
from testcluster.kubelet.nodes import NodeSpec
from testcluster.load import SteadyLoad
from testcluster.rest import ApiError, Kube
from testcluster.serviceproxy import ServiceProxy
from testcluster.strays import MARKER, new_session_id
from testcluster.waiting import wait_for

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "examples" / "weightcache-cpu.yaml"
NS = "bench"
WC = f"/apis/weightcache.io/v1alpha1/namespaces/{NS}/weightcaches/tiny-llama"
ENGINES = "weightcache.io/cache=tiny-llama,weightcache.io/component=engine"
DAEMONS = "weightcache.io/cache=tiny-llama,weightcache.io/component=daemon"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lists(kube: Kube, path: str) -> bool:
    try:
        kube.get(path)
        return True
    except ApiError:
        return False


def status(kube: Kube) -> dict:
    return kube.get(WC).get("status") or {}


def daemon_facts(kube: Kube) -> dict[str, tuple[str, int, int]]:
    """Daemon pod → (uid, container restarts, checkpoint bytes its ranks read, per the daemon)."""
    facts = {}
    for pod in kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=DAEMONS)["items"]:
        with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9400/status", timeout=10) as response:
            report = json.loads(response.read())
        restarts = sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []))
        facts[pod["metadata"]["name"]] = (pod["metadata"]["uid"], restarts,
                                          sum(r["disk_bytes_read"] or 0 for r in report["ranks"]))  # fmt: skip
    return facts


def engines_ready_on(kube: Kube, version: str, count: int) -> bool:
    pods = kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=ENGINES)["items"]

    def new(p: dict) -> bool:
        env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0].get("env", [])}
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
        return env.get("BENCH_VERSION") == version and ready and not p["metadata"].get("deletionTimestamp")
    return len(pods) == count and all(map(new, pods))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for each phase")
    args = parser.parse_args()

    control_plane_binary()
    client_tools()
    work = Path(tempfile.mkdtemp(prefix="rolling-upgrade-"))
    session = new_session_id()
    plane = ControlPlane(work / "cluster", node_monitor_grace_period=6, environment={MARKER: session})
    plane.start()
    kube = Kube.from_kubeconfig(plane.kubeconfig)
    nodes = [NodeSpec(f"node-{i + 1}", labels={"weightcache.io/test-node": "true"}) for i in range(2)]
    kubelet = ProcessKubelet(kube, plane.port, KubeletConfig(
        root=work / "kubelet", nodes=nodes, serving_cert=plane.kubelet_serving_cert,
        environment={MARKER: session, "PYTHONPATH": str(REPO / "daemon_image")}))  # fmt: skip
    operator: subprocess.Popen | None = None
    proxy: ServiceProxy | None = None
    try:
        kubelet.start()
        from weightcache_operator.crd import custom_resource_definition, render

        plane.kubectl("apply", "--server-side", "-f", "-", input=render())
        plane.kubectl("wait", "--for=condition=Established", f"crd/{custom_resource_definition()['metadata']['name']}")
        plane.kubectl("apply", "--server-side", "-f", str(REPO / "crds" / "kopf-peering.yaml"))
        plane.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev")
        # The peering object the operator waits for (mandatory peering) ships in deploy/operator.yaml.
        deployed = yaml.safe_load_all((REPO / "deploy" / "operator.yaml").read_text())
        peering = next(d for d in deployed if d and d["kind"] == "ClusterKopfPeering")
        plane.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(peering))
        # Right after a CRD is Established its storage may still answer 429; kopf's peering
        # start-up does not always recover from that, so wait until both kinds list.
        wait_for(lambda: _lists(kube, "/apis/kopf.dev/v1/clusterkopfpeerings")
                 and _lists(kube, "/apis/weightcache.io/v1alpha1/weightcaches"), 60)  # fmt: skip
        kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        wait_for(lambda: kube.get(f"/api/v1/namespaces/{NS}/serviceaccounts/default"), 30)

        made = work / "tiny-llama"
        subprocess.run([sys.executable, "-m", "weightcache", "gen-checkpoint", str(made)], check=True,
                       capture_output=True)  # fmt: skip
        for node in nodes:
            shutil.copytree(made, kubelet.node_root(node.name) / "models" / "tiny-llama")

        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig), MARKER: session,
               "WEIGHTCACHE_OPERATOR_RESYNC_SECONDS": "5", "WEIGHTCACHE_OPERATOR_METRICS": f"127.0.0.1:{free_port()}",
               "WEIGHTCACHE_OPERATOR_HEALTH": f"127.0.0.1:{free_port()}"}  # fmt: skip
        operator = subprocess.Popen([sys.executable, "-m", "weightcache_operator"], env=env,
                                    stdout=(work / "operator.log").open("w"), stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip

        body = yaml.safe_load(SAMPLE.read_text())
        body["spec"]["engine"]["replicas"] = args.replicas
        container = body["spec"]["engine"]["template"]["spec"]["containers"][0]
        container["env"].append({"name": "BENCH_VERSION", "value": "1"})
        plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(body))
        wait_for(lambda: status(kube).get("phase") == "Ready" and engines_ready_on(kube, "1", 2 * args.replicas)
                 and all(n.get("fingerprint") for n in status(kube).get("nodes", [])), args.timeout, interval=1,
                 describe=lambda: status(kube))  # fmt: skip
        before = daemon_facts(kube)

        proxy = ServiceProxy(kube, NS, "tiny-llama", 8000).start()
        proxy.wait_for_ready(args.replicas, timeout=60)
        load = SteadyLoad(*proxy.address).start()
        time.sleep(5)  # a steady state before the change
        container["env"][-1]["value"] = "2"
        started = time.monotonic()
        plane.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(body))
        replica_done: list[float] = []
        while True:
            rollout = status(kube).get("rollout") or {}
            while rollout.get("revision") and len(replica_done) < min(rollout.get("updated", 0), args.replicas):
                replica_done.append(time.monotonic() - started)
            if rollout.get("phase") == "Complete" and engines_ready_on(kube, "2", 2 * args.replicas):
                break
            if rollout.get("phase") == "Stalled" or time.monotonic() - started > args.timeout:
                raise SystemExit(f"rollout did not complete: {rollout}")
            time.sleep(0.2)
        total = time.monotonic() - started
        time.sleep(5)  # and after it
        result = load.stop()
        after = daemon_facts(kube)

        read = sum(after[p][2] for p in after) - sum(before[p][2] for p in before if p in after)
        restarts = sum(after[p][1] for p in after) - sum(before[p][1] for p in before if p in after)
        per_replica = [b - a for a, b in zip([0.0, *replica_done], replica_done)]
        rows = [
            ("replicas (each with 1 standby)", str(args.replicas)),
            ("requests sent / ok", f"{result.sent} / {result.ok}"),
            ("failed requests (after one retry)", str(len(result.failed))),
            ("requests that needed their retry", str(result.retried)),
            ("weight bytes read from disk during the rollout", str(read)),
            ("daemon pods replaced / container restarts", f"{len(set(before) - set(after))} / {restarts}"),
            ("total rollout time (s)", f"{total:.1f}"),
            ("time per replica (s)", ", ".join(f"{s:.1f}" for s in per_replica)),
        ]
        width = max(len(r[0]) for r in rows)
        print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
        for name, value in rows:
            print(f"| {name:<{width}} | {value} |")
        if result.failed:
            print("failures:", *result.failed[:10], sep="\n  ")
    finally:
        if proxy is not None:
            proxy.stop()
        if operator is not None and operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            operator.wait(timeout=30)
        kubelet.stop()
        plane.stop()


if __name__ == "__main__":
    main()
