"""Daemon generation change benchmark: blue/green against node by node, one replica with a hot
standby under steady load through the Service, on the real control plane with the process
kubelet (2 nodes, or 1 with ``--nodes 1``; cpu-shm, the reference engine), the operator
running as a process.

For each strategy it applies examples/weightcache-cpu.yaml (``spec.daemon.generationChange``
NodeByNode, then Auto, which is blue/green here: the daemons report the host's free memory and
the tiny model fits twice), waits until it is Ready, starts one client that sends completions
back to back through a kube-proxy-like proxy (retrying a failed request once), changes
``spec.model.revision`` (new weights: every daemon loads again) and waits until the rollout is
Complete and only new-generation daemons are left. It prints, per strategy: the decision and its
reason, failed requests, the time the Service had no Ready endpoint, the most daemon pods one
node ran at once, checkpoint bytes the new daemons read, and the total time. A script, not a
test: it prints a table and asserts nothing.

    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/generation_change.py
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import Counter

from sample_cluster import DAEMONS, NS, WC, SampleCluster, sample, sample_cluster
from testcluster.load import SteadyLoad
from testcluster.sample import converged
from testcluster.serviceproxy import ServiceProxy
from testcluster.waiting import wait_for


def one_change(cluster: SampleCluster, requested: str, timeout: float, nodes: int) -> list[tuple[str, str]]:
    body = sample()
    body["spec"]["daemon"]["generationChange"] = requested
    body["spec"]["model"]["revision"] = "seed-0"
    cluster.apply(body)
    wait_for(
        lambda: (
            converged(cluster.status())
            and len(cluster.status().get("nodes", [])) == nodes
            and all(n.get("fingerprint") for n in cluster.status()["nodes"])
        ),
        timeout,
        interval=1,
        describe=cluster.status,
    )
    old_hash = cluster.status()["daemonSpecHash"]
    proxy = ServiceProxy(cluster.kube, NS, "tiny-llama", 8000).start()
    peak: Counter[str] = Counter()
    stop = threading.Event()

    def sample_daemons() -> None:
        while not stop.is_set():
            live = Counter(
                p["spec"].get("nodeName") for p in cluster.pods(DAEMONS) if not p["metadata"].get("deletionTimestamp")
            )
            for node, count in live.items():
                peak[node] = max(peak[node], count)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample_daemons, daemon=True)
    try:
        proxy.wait_for_ready(1, timeout=60)
        load = SteadyLoad(*proxy.address).start()
        sampler.start()
        time.sleep(5)  # a steady state before the change
        body["spec"]["model"]["revision"] = "seed-1"
        started, start_wall = time.monotonic(), time.time()
        cluster.apply(body)

        def finished() -> bool:
            status = cluster.status()
            daemons = cluster.pods(DAEMONS)
            return (
                status.get("daemonSpecHash") != old_hash
                and (status.get("rollout") or {}).get("phase") == "Complete"
                and converged(status)
                and len(daemons) == nodes
                and all(
                    p["metadata"]["annotations"]["weightcache.io/daemon-spec-hash"] == status["daemonSpecHash"]
                    for p in daemons
                )
            )

        wait_for(finished, timeout, interval=0.2, describe=cluster.status)
        total = time.monotonic() - started
        time.sleep(5)  # and after it
        result = load.stop()
        stop.set()
        sampler.join()
        changes = [(c.observed_at, bool(c.ready)) for c in proxy.changes if c.observed_at >= start_wall]
    finally:
        stop.set()
        proxy.stop()
    status = cluster.status()
    decided = next((c for c in status.get("conditions", []) if c["type"] == "GenerationChange"), {})
    uid = cluster.kube.get(WC)["metadata"]["uid"]  # events of this run's WeightCache, not the previous one's
    events = cluster.kube.get(f"/api/v1/namespaces/{NS}/events")["items"]
    progress = [
        e["message"]
        for e in events
        if e.get("reason") == "RolloutProgressing"
        and "Generation" in e["message"]
        and e["involvedObject"].get("uid") == uid
    ]
    read = sum(bytes_read for _uid, _restarts, bytes_read in cluster.daemon_facts().values())
    cluster.plane.kubectl("delete", "wc", "tiny-llama", "-n", NS, "--wait=true", "--timeout=180s")
    return [
        ("spec.daemon.generationChange", requested),
        (
            "decision (RolloutProgressing event)",
            progress[-1].split("; ")[-1] if progress else f"{decided.get('reason')}",
        ),
        ("requests sent / ok", f"{result.sent} / {result.ok}"),
        ("failed requests (after one retry)", str(len(result.failed))),
        ("requests that needed their retry", str(result.retried)),
        ("time without a Ready endpoint (s)", f"{_gap(changes, start_wall, start_wall + total):.1f}"),
        ("most daemon pods on one node at once", str(max(peak.values(), default=0))),
        ("checkpoint bytes the new daemons read", str(read)),
        ("total time to the last old daemon gone (s)", f"{total:.1f}"),
    ]


def _gap(changes: list[tuple[float, bool]], start: float, end: float) -> float:
    """Seconds in [start, end] during which the proxy had no ready endpoint (it had one at start)."""
    gap, empty_since = 0.0, None
    for at, ready in changes:
        if not ready and empty_since is None:
            empty_since = at
        elif ready and empty_since is not None:
            gap += at - empty_since
            empty_since = None
    if empty_since is not None:
        gap += max(0.0, end - empty_since)
    return gap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for each phase")
    parser.add_argument("--nodes", type=int, default=2, choices=(1, 2), help="nodes holding the cache")
    args = parser.parse_args()
    rows: list[list[tuple[str, str]]] = []
    with sample_cluster("generation-change-", nodes=args.nodes) as cluster:
        for requested in ("NodeByNode", "Auto"):
            rows.append(one_change(cluster, requested, args.timeout, args.nodes))
    width = max(len(name) for name, _ in rows[0])
    print(f"| {'measure':<{width}} | node by node | auto |\n|{'-' * (width + 2)}|---|---|")
    for (name, first), (_, second) in zip(*rows):
        print(f"| {name:<{width}} | {first} | {second} |")


if __name__ == "__main__":
    main()
