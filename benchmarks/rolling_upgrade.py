"""Rolling engine upgrade benchmark: ``--replicas`` replicas (default 4, each with a hot standby)
under steady load through the Service, rolled ``--max-surge`` at a time
(``spec.engine.rollout.maxSurge``), on the real control plane with the process kubelet (2 nodes,
cpu-shm, the reference engine), the operator running as a process.

It applies examples/weightcache-cpu.yaml with those replicas, waits until it is Ready, starts one
client that sends completions back to back through a kube-proxy-like proxy (retrying a failed
request once), changes the engine template (an env variable) and waits for the rollout to
complete, watching the engine pods every 0.2 s. It prints failed requests, the checkpoint bytes
the daemons read during the rollout (their own disk_bytes_read counters), daemon restarts, total
time, how many engine starts ran in sequence (the longest chain of new-version engines each
started after the one before it had finished its replica), the most surges in flight at once, and
per replica when its new engine appeared, how long it took to turn Ready, and when the replica was
whole again. A script, not a test: it prints tables and asserts nothing.

    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/rolling_upgrade.py --replicas 4 --max-surge 2
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from typing import Any

from sample_cluster import ENGINES, NS, SampleCluster, print_table, sample, sample_cluster
from testcluster.load import SteadyLoad
from testcluster.sample import converged
from testcluster.serviceproxy import ServiceProxy
from testcluster.waiting import wait_for


def version_of(pod: dict[str, Any]) -> str | None:
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    return env.get("BENCH_VERSION")


def is_ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def engines_ready_on(cluster: SampleCluster, version: str, count: int) -> bool:
    pods = cluster.pods(ENGINES)

    def new(p: dict) -> bool:
        return version_of(p) == version and is_ready(p) and not p["metadata"].get("deletionTimestamp")

    return len(pods) == count and all(map(new, pods))


@dataclass
class Replica:
    """When (seconds after the change) the watcher first saw each of one replica's moments."""

    surge: float | None = None
    """Its first new-version engine (the surge) exists."""
    ready: float | None = None
    """A new-version engine of it is Ready."""
    whole: float | None = None
    """No old pod is left (terminating ones included) and its new active and standby are Ready."""


def observe(pods: list[dict[str, Any]], replicas: list[Replica], at: float) -> int:
    """Records what ``pods`` show of each replica at ``at``; returns how many replicas have a
    surge in flight (a new-version engine while their active is still an old one)."""
    in_flight = 0
    for number, seen in enumerate(replicas):
        mine = [p for p in pods if p["metadata"]["labels"].get("weightcache.io/replica") == str(number)]
        new = [p for p in mine if version_of(p) == "2"]
        old_active = any(
            version_of(p) != "2"
            and p["metadata"]["labels"].get("weightcache.io/role") == "active"
            and not p["metadata"].get("deletionTimestamp")
            for p in mine
        )
        in_flight += bool(new) and old_active
        if new and seen.surge is None:
            seen.surge = at
        if seen.ready is None and any(map(is_ready, new)):
            seen.ready = at
        if seen.whole is None and len(new) == len(mine) == 2 and all(map(is_ready, new)):
            seen.whole = at
    return in_flight


def starts_in_sequence(replicas: list[Replica]) -> int:
    """The longest chain of new engines in which each started only after the previous one's
    replica was whole: ⌈replicas / maxSurge⌉ when every slot is refilled at once."""
    spans = sorted((r.surge, r.whole) for r in replicas if r.surge is not None and r.whole is not None)
    depth: list[int] = []
    for i, (start, _) in enumerate(spans):
        depth.append(1 + max((depth[j] for j in range(i) if spans[j][1] <= start), default=0))
    return max(depth, default=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--max-surge", type=int, default=1, help="spec.engine.rollout.maxSurge")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for each phase")
    args = parser.parse_args()

    with sample_cluster("rolling-upgrade-") as cluster:
        body = sample()
        body["spec"]["engine"]["replicas"] = args.replicas
        body["spec"]["engine"]["rollout"] = {"maxSurge": args.max_surge}
        container = body["spec"]["engine"]["template"]["spec"]["containers"][0]
        container["env"].append({"name": "BENCH_VERSION", "value": "1"})
        cluster.apply(body)
        wait_for(
            lambda: (
                converged(cluster.status())
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
            replicas = [Replica() for _ in range(args.replicas)]
            most_in_flight = 0
            while True:
                rollout = cluster.status().get("rollout") or {}
                at = time.monotonic() - started
                most_in_flight = max(most_in_flight, observe(cluster.pods(ENGINES), replicas, at))
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
    print_table(
        [
            ("replicas (each with 1 standby) / maxSurge", f"{args.replicas} / {args.max_surge}"),
            ("requests sent / ok", f"{result.sent} / {result.ok}"),
            ("failed requests (after one retry)", str(len(result.failed))),
            ("requests that needed their retry", str(result.retried)),
            ("weight bytes read from disk during the rollout", str(read)),
            ("daemon pods replaced / container restarts", f"{len(set(before) - set(after))} / {restarts}"),
            ("total rollout time (s)", f"{total:.1f}"),
            ("engine starts in sequence", str(starts_in_sequence(replicas))),
            ("surges in flight at once, at most", str(most_in_flight)),
        ]
    )

    def when(t: float | None) -> str:
        return "-" if t is None else f"{t:.1f}"

    print_table(
        [
            (
                f"replica {n}: new engine seen / Ready / replica whole (s)",
                f"{when(r.surge)} / {when(r.ready)} / {when(r.whole)}",
            )
            for n, r in enumerate(replicas)
        ]
    )
    if result.failed:
        print("failures:", *result.failed[:10], sep="\n  ")


if __name__ == "__main__":
    main()
