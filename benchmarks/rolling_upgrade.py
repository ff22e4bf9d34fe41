"""Rolling engine upgrade benchmark: 2 replicas (each with a hot standby) under steady load through
the Service, on the real control plane with the process kubelet (2 nodes, cpu-shm, the reference
engine), the operator running as a process.

It applies examples/weightcache-cpu.yaml with 2 replicas, waits until it is Ready, starts one
client that sends completions back to back through a kube-proxy-like proxy (retrying a failed
request once), changes the engine template (an env variable) and waits for the rollout to
complete. It prints failed requests, the checkpoint bytes the daemons read during the rollout
(their own disk_bytes_read counters), daemon restarts, total time and the time per replica
(from status.rollout.updated). A script, not a test: it prints a table and asserts nothing.

    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/rolling_upgrade.py
"""

from __future__ import annotations

import argparse
import time

from sample_cluster import ENGINES, NS, SampleCluster, print_table, sample, sample_cluster
from testcluster.load import SteadyLoad
from testcluster.serviceproxy import ServiceProxy
from testcluster.waiting import wait_for


def engines_ready_on(cluster: SampleCluster, version: str, count: int) -> bool:
    pods = cluster.pods(ENGINES)

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

    with sample_cluster("rolling-upgrade-") as cluster:
        body = sample()
        body["spec"]["engine"]["replicas"] = args.replicas
        container = body["spec"]["engine"]["template"]["spec"]["containers"][0]
        container["env"].append({"name": "BENCH_VERSION", "value": "1"})
        cluster.apply(body)
        wait_for(
            lambda: (
                cluster.status().get("phase") == "Ready"
                and engines_ready_on(cluster, "1", 2 * args.replicas)
                and all(n.get("fingerprint") for n in cluster.status().get("nodes", []))
            ),
            args.timeout,
            interval=1,
            describe=cluster.status,
        )
        before = cluster.daemon_facts()

        proxy = ServiceProxy(cluster.kube, NS, "tiny-llama", 8000).start()
        try:
            proxy.wait_for_ready(args.replicas, timeout=60)
            load = SteadyLoad(*proxy.address).start()
            time.sleep(5)  # a steady state before the change
            container["env"][-1]["value"] = "2"
            started = time.monotonic()
            cluster.apply(body)
            replica_done: list[float] = []
            while True:
                rollout = cluster.status().get("rollout") or {}
                while rollout.get("engineTemplateHash") and len(replica_done) < min(
                    rollout.get("updated", 0), args.replicas
                ):
                    replica_done.append(time.monotonic() - started)
                if rollout.get("phase") == "Complete" and engines_ready_on(cluster, "2", 2 * args.replicas):
                    break
                if rollout.get("phase") == "Stalled" or time.monotonic() - started > args.timeout:
                    raise SystemExit(f"rollout did not complete: {rollout}")
                time.sleep(0.2)
            total = time.monotonic() - started
            time.sleep(5)  # and after it
            result = load.stop()
        finally:
            proxy.stop()
        after = cluster.daemon_facts()

    read = sum(after[p][2] for p in after) - sum(before[p][2] for p in before if p in after)
    restarts = sum(after[p][1] for p in after) - sum(before[p][1] for p in before if p in after)
    per_replica = [b - a for a, b in zip([0.0, *replica_done], replica_done)]
    print_table(
        [
            ("replicas (each with 1 standby)", str(args.replicas)),
            ("requests sent / ok", f"{result.sent} / {result.ok}"),
            ("failed requests (after one retry)", str(len(result.failed))),
            ("requests that needed their retry", str(result.retried)),
            ("weight bytes read from disk during the rollout", str(read)),
            ("daemon pods replaced / container restarts", f"{len(set(before) - set(after))} / {restarts}"),
            ("total rollout time (s)", f"{total:.1f}"),
            ("time per replica (s)", ", ".join(f"{s:.1f}" for s in per_replica)),
        ]
    )
    if result.failed:
        print("failures:", *result.failed[:10], sep="\n  ")


if __name__ == "__main__":
    main()
