"""Scale benchmark: the operator against a fleet of hollow nodes (a control-plane simulation, as
kubemark's: testcluster/kubelet/hollow.py) next to the two real process-kubelet nodes of the
README sample.

``--nodes`` hollow nodes in pools of ``--nodes // --caches``, one hollow cache per pool (every
``--multi-node-every``-th one a multi-node engine group: tensor 2 over 2 nodes), one replica with
one hot standby each; plus the sample (tiny-llama) on the real nodes with real daemons and
engines. Hollow daemons report what the benchmark sets; nothing runs on hollow nodes.

Measured, and printed as tables:

- apply → phase Ready per hollow cache (all applied at once);
- passes: count and latency quantiles from the operator's own ``/metrics``
  (``weightcache_operator_reconcile_seconds``; a quantile is the histogram bucket bound it falls
  under), daemon ``GET /status`` reads per pass (``weightcache_operator_daemon_status_reads_total``);
  the real sample's passes and the hollow caches' apart;
- the passes the operator logged as slow (``slow pass``: at least ``SLOW_PASS_SECONDS``), their
  count and mean time per step;
- where the passes' time went: count, mean and quantiles of each step of a pass
  (``weightcache_operator_pass_step_seconds``) and of the operator's API requests by verb
  (``weightcache_operator_api_request_seconds``);
- the operator process's CPU (utime + stime from /proc) and memory (VmRSS, VmHWM);
- API requests by verb/resource/scope from the API server's own ``apiserver_request_total``,
  per second and per pass — all clients together: the kubelets' and controllers' share is the
  scope/resource the operator does not use (leases, cluster-scope pods);
- in a steady window and in a churn window: hollow nodes going NotReady and back, hollow
  daemons failing and recovering, while the real sample's active engine is killed
  ``--promotions`` times (pod deletion and SIGKILL in turn): detection and promotion from
  ``status.lastFailover``.

Targets (issue 20): pass p99 ≤ 1 s, operator memory ≤ 500 MiB, no LIST per event that grows with
the fleet (``LIST nodes`` stays at 0 after start), daemon status reads concurrent and bounded,
promotion p50 ≤ 500 ms under churn. A script, not a test: it prints and asserts nothing.

    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/scale.py --nodes 500 --caches 50
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from failover import container_pgid, pct, wait_whole
from sample_cluster import NS, free_port, sample, sample_cluster
from testcluster.kubelet.hollow import HollowFleet
from testcluster.kubelet.hollowdaemons import HollowDaemonState
from testcluster.kubelet.nodes import NodeSpec
from testcluster.rest import Kube
from testcluster.sample import converged
from testcluster.waiting import wait_for
from weightcache_operator.act.metrics import PASS_STEPS
from weightcache_operator.run.reconcile import SLOW_PASS_SECONDS

POOL_LABEL = "weightcache.io/hollow-pool"
CACHES = f"/apis/weightcache.io/v1alpha1/namespaces/{NS}/weightcaches"
WC = f"{CACHES}/tiny-llama"
TICK = os.sysconf("SC_CLK_TCK")
PASSES = "weightcache_operator_reconcile_seconds"
Keep = Callable[[dict[str, str]], bool]
"""Which series of a histogram to sum, by their labels."""


def every(_labels: dict[str, str]) -> bool:
    return True


def hollow_cache_series(labels: dict[str, str]) -> bool:
    return labels.get("cache", "").startswith("hollow-")


def labelled(key: str, value: str) -> Keep:
    return lambda labels: labels.get(key) == value


def hollow_cache(index: int, multi_node: bool) -> dict[str, Any]:
    body = sample()
    body["metadata"] = {"name": f"hollow-{index:03d}"}
    spec = body["spec"]
    spec["placement"] = {"nodeSelector": {POOL_LABEL: f"p{index:03d}"}}
    spec["parallelism"] = {"tensor": 2, "nodes": 2} if multi_node else {"tensor": 2}
    return body


# --- what the processes say about themselves ------------------------------------------------------


def scrape(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            labels = dict(re.findall(r'(\w+)="([^"]*)"', head[len(name) :]))
            found.append((labels, float(value)))
    return found


class Sample:
    """One look at the operator and the API server."""

    def __init__(self, kube: Kube, operator_metrics: str, pid: int, log: Path) -> None:
        import urllib.request

        self.at = time.monotonic()
        self.slow = [
            record
            for line in log.read_text().splitlines()
            if '"slow pass"' in line and (record := json.loads(line)).get("message") == "slow pass"
        ]
        """Every pass the operator logged as slow so far (reconcile.SLOW_PASS_SECONDS)."""
        with urllib.request.urlopen(f"http://{operator_metrics}/metrics", timeout=10) as response:
            self.operator = response.read().decode()
        self.apiserver = str(kube.request("GET", "/metrics"))
        fields = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
        self.cpu_s = (int(fields[11]) + int(fields[12])) / TICK
        status = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
        self.rss_mib = int(status["VmRSS"].split()[0]) / 1024
        self.hwm_mib = int(status["VmHWM"].split()[0]) / 1024

    def passes(self) -> float:
        return sum(v for _l, v in scrape(self.operator, "weightcache_operator_reconcile_total"))

    def buckets(self, histogram: str = PASSES, keep: Keep = every) -> dict[float, float]:
        """The histogram's bucket counts summed over its series (those whose labels ``keep`` takes)."""
        sums: Counter[float] = Counter()
        for labels, value in scrape(self.operator, histogram + "_bucket"):
            if keep(labels):
                sums[float("inf") if labels["le"] == "+Inf" else float(labels["le"])] += value
        return dict(sums)

    def count(self, histogram: str = PASSES, keep: Keep = every) -> float:
        return self.buckets(histogram, keep).get(float("inf"), 0.0)

    def total(self, histogram: str, keep: Keep = every) -> float:
        """The histogram's ``_sum`` over its series whose labels ``keep`` takes."""
        return sum(v for labels, v in scrape(self.operator, histogram + "_sum") if keep(labels))

    def count_of(self, counter: str, source: str) -> float:
        return sum(v for labels, v in scrape(self.operator, counter) if labels.get("source") == source)

    def reads(self) -> float:
        return sum(v for _l, v in scrape(self.operator, "weightcache_operator_daemon_status_reads_total"))

    def requests(self) -> Counter[tuple[str, str, str]]:
        counts: Counter[tuple[str, str, str]] = Counter()
        for labels, value in scrape(self.apiserver, "apiserver_request_total"):
            counts[(labels.get("verb", ""), labels.get("resource", ""), labels.get("scope", ""))] += value
        return counts


def quantile(before: Sample, after: Sample, q: float, histogram: str = PASSES, keep: Keep = every) -> str:
    a, b = after.buckets(histogram, keep), before.buckets(histogram, keep)
    delta = {bound: a.get(bound, 0) - b.get(bound, 0) for bound in sorted(a)}
    total = delta.get(float("inf"), 0)
    if not total:
        return "-"
    for bound, count in delta.items():
        if count >= q * total:
            return f"≤ {bound:g} s" if bound != float("inf") else "> 60 s"
    return "?"


def window(label: str, before: Sample, after: Sample, rows: list[tuple[str, str]], top: int = 14) -> None:
    seconds = after.at - before.at
    passes = after.passes() - before.passes()
    rows += [
        (f"{label}: window", f"{seconds:.0f} s"),
        (f"{label}: passes", f"{passes:.0f} ({passes / seconds:.1f}/s)"),
        (f"{label}: pass p50 / p99", f"{quantile(before, after, 0.5)} / {quantile(before, after, 0.99)}"),
    ]
    for who, keep in (("the real sample's", labelled("cache", "tiny-llama")), ("hollow caches'", hollow_cache_series)):
        rows.append(
            (
                f"{label}: pass p50 / p99, {who} passes only",
                f"{quantile(before, after, 0.5, PASSES, keep)} / {quantile(before, after, 0.99, PASSES, keep)}"
                f" ({after.count(PASSES, keep) - before.count(PASSES, keep):.0f} passes)",
            )
        )
    slow = after.slow[len(before.slow) :]
    rows.append((f"{label}: passes ≥ {SLOW_PASS_SECONDS:g} s (the operator's slow pass log)", f"{len(slow)}"))
    if slow:
        # Where the slow passes' own time went, step by step (the histograms below mix them
        # with every fast pass).
        steps: Counter[str] = Counter()
        for record in slow:
            steps.update(record["steps_ms"])
        rows.append(
            (
                f"{label}: slow passes, mean ms per step",
                ", ".join(f"{step} {ms / len(slow):.0f}" for step, ms in steps.most_common()),
            )
        )
        rows.append(
            (
                f"{label}: slow passes, by cache",
                ", ".join(f"{c} {n}" for c, n in Counter(r["cache"] for r in slow).most_common(6)),
            )
        )
    read = {
        source: after.count_of("weightcache_operator_pod_reads_total", source)
        - before.count_of("weightcache_operator_pod_reads_total", source)
        for source in ("watch", "list")
    }
    rows.append((f"{label}: passes' pods from the watch / by LIST", f"{read['watch']:.0f} / {read['list']:.0f}"))
    rows.append((f"{label}: daemon status reads per pass", f"{(after.reads() - before.reads()) / max(passes, 1):.2f}"))
    # Where the passes' time went: each step (the operator's pass_step histogram), then the API
    # server's latency as the operator waited for it, by verb.
    for histogram, key, values in (
        ("weightcache_operator_pass_step_seconds", "step", PASS_STEPS),
        ("weightcache_operator_api_request_seconds", "verb", ("GET", "LIST", "APPLY", "PATCH", "POST", "DELETE")),
    ):
        for value in values:
            only = labelled(key, value)
            count = after.count(histogram, only) - before.count(histogram, only)
            if not count:
                continue
            spent = after.total(histogram, only) - before.total(histogram, only)
            rows.append(
                (
                    f"{label}: {key} {value}",
                    f"{count:.0f}×, mean {1000 * spent / count:.0f} ms, p50 / p99 "
                    f"{quantile(before, after, 0.5, histogram, only)} / "
                    f"{quantile(before, after, 0.99, histogram, only)}",
                )
            )
    rows += [
        (f"{label}: operator CPU", f"{100 * (after.cpu_s - before.cpu_s) / seconds:.0f} % of one core"),
        (f"{label}: operator RSS (peak so far)", f"{after.rss_mib:.0f} MiB ({after.hwm_mib:.0f} MiB)"),
    ]
    got = after.requests() - before.requests()
    rows.append((f"{label}: API requests, all clients", f"{sum(got.values()) / seconds:.0f}/s"))
    for (verb, resource, scope), count in got.most_common(top):
        rows.append(
            (f"{label}: {verb} {resource} ({scope})", f"{count / seconds:.1f}/s, {count / max(passes, 1):.2f}/pass")
        )
    nodes_lists = got.get(("LIST", "nodes", "cluster"), 0)
    rows.append((f"{label}: LIST nodes (cluster)", f"{nodes_lists:.0f}"))


# --- churn --------------------------------------------------------------------------------------


class Churn:
    """Every ``interval`` s one hollow node goes NotReady and one hollow node's daemons fail, each
    for ``hold`` s."""

    def __init__(self, fleet: HollowFleet, nodes: list[str], interval: float, hold: float) -> None:
        self.fleet, self.nodes, self.interval, self.hold = fleet, nodes, interval, hold
        self._stop = threading.Event()
        self.events = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name="churn")

    def start(self) -> Churn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.hold + 30)

    def _run(self) -> None:
        rng = random.Random(20)
        pending: list[tuple[float, str, str]] = []
        while not self._stop.wait(self.interval):
            node, daemon = rng.sample(self.nodes, 2)
            self.fleet.set_node_ready(node, False)
            self.fleet.set_daemon(daemon, HollowDaemonState("failed"))
            self.events += 2
            pending += [(time.monotonic() + self.hold, "node", node), (time.monotonic() + self.hold, "daemon", daemon)]
            self._restore(pending, time.monotonic())
        self._restore(pending, float("inf"))

    def _restore(self, pending: list[tuple[float, str, str]], now: float) -> None:
        for entry in [p for p in pending if p[0] <= now]:
            pending.remove(entry)
            if entry[1] == "node":
                self.fleet.set_node_ready(entry[2], True)
            else:
                self.fleet.set_daemon(entry[2], HollowDaemonState())


def promote(cluster: Any, kind: str) -> tuple[float, float]:
    """Kills the sample's active engine; returns (detection s, promotion s) from lastFailover."""
    status = wait_whole(cluster.kube, cluster.operator, 300)
    active = status["engines"][0]["active"]
    previous = (status.get("lastFailover") or {}).get("time")
    at = time.time()
    if kind == "delete":
        cluster.kube.delete(f"/api/v1/namespaces/{NS}/pods/{active}")
    else:
        os.killpg(container_pgid(cluster.kubelet, active), signal.SIGKILL)
    last = wait_for(
        lambda: (f := cluster.kube.get(WC).get("status", {}).get("lastFailover")) and f["time"] != previous and f,
        120,
        interval=0.05,
        describe="no failover recorded",
    )
    noticed = datetime.fromisoformat(last["time"].replace("Z", "+00:00")).timestamp()
    return noticed - at, last["promotionMs"] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=500, help="hollow nodes")
    parser.add_argument("--caches", type=int, default=50, help="hollow caches, one per pool of nodes")
    parser.add_argument("--multi-node-every", type=int, default=3, help="every n-th hollow cache: 2-node engine groups")
    parser.add_argument("--steady", type=float, default=60, help="seconds of the steady window")
    parser.add_argument("--promotions", type=int, default=6, help="kills of the real active engine under churn")
    parser.add_argument("--churn-interval", type=float, default=2.0)
    parser.add_argument("--churn-hold", type=float, default=6.0)
    options = parser.parse_args()
    pool = options.nodes // options.caches
    assert pool >= 2, "at least 2 hollow nodes per cache (multi-node groups need 2)"
    rows: list[tuple[str, str]] = [
        ("hollow nodes / caches / nodes per pool", f"{options.nodes} / {options.caches} / {pool}"),
        ("machine load at start (1/5/15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg())),
        ("cpus", str(os.cpu_count())),
    ]
    metrics_port = str(free_port())
    env = {
        "WEIGHTCACHE_OPERATOR_RESYNC_SECONDS": "30",
        "WEIGHTCACHE_OPERATOR_METRICS": f"127.0.0.1:{metrics_port}",
    }
    with sample_cluster("weightcache-scale-bench-", operator_env=env, node_monitor_grace_period=40) as cluster:
        started = time.monotonic()
        specs = [
            NodeSpec(f"hollow-{i:04d}", labels={POOL_LABEL: f"p{i // pool:03d}"}) for i in range(pool * options.caches)
        ]
        fleet = HollowFleet(cluster.kube, specs)
        fleet.start()
        rows.append(("hollow nodes registered in", f"{time.monotonic() - started:.1f} s"))
        log = cluster.work / "operator.log"
        look = lambda: Sample(cluster.kube, f"127.0.0.1:{metrics_port}", cluster.operator.pid, log)  # noqa: E731
        try:
            cluster.apply(sample())
            wait_whole(cluster.kube, cluster.operator, 600)
            rows.append(("real sample Ready (from cluster start)", f"{time.monotonic() - started:.0f} s"))

            applied: dict[str, float] = {}
            ready_at: dict[str, float] = {}
            before_apply = look()
            for i in range(options.caches):
                body = hollow_cache(i, options.multi_node_every > 0 and i % options.multi_node_every == 0)
                cluster.kube.create(CACHES, body)
                applied[body["metadata"]["name"]] = time.monotonic()

            def all_ready() -> bool:
                for item in cluster.kube.get(CACHES)["items"]:
                    name = item["metadata"]["name"]
                    if name in applied and name not in ready_at and converged(item.get("status") or {}):
                        ready_at[name] = time.monotonic()
                return len(ready_at) == len(applied)

            wait_for(all_ready, 1200, interval=0.5, describe=lambda: f"{len(ready_at)}/{len(applied)} Ready")
            settle = [ready_at[n] - applied[n] for n in applied]
            rows.append(
                ("hollow cache apply → Ready p50 / max", f"{statistics.median(settle):.1f} s / {max(settle):.1f} s")
            )
            window("rollout", before_apply, look(), rows, top=8)

            time.sleep(10)
            steady = look()
            time.sleep(options.steady)
            window("steady", steady, look(), rows)

            hollow = [s.name for s in specs]
            churn = Churn(fleet, hollow, options.churn_interval, options.churn_hold).start()
            time.sleep(options.churn_hold)
            before_churn = look()
            promotions = []
            for k in range(options.promotions):
                promotions.append(promote(cluster, "delete" if k % 2 == 0 else "SIGKILL"))
                print(f"promotion {k + 1}: detection {promotions[-1][0] * 1000:.0f} ms, "
                      f"promotion {promotions[-1][1] * 1000:.0f} ms", flush=True)  # fmt: skip
            after_churn = look()
            churn.stop()
            window("churn", before_churn, after_churn, rows)
            rows.append(("churn events (node NotReady, daemon failed)", f"{churn.events}"))
            if promotions:
                detect = [p[0] * 1000 for p in promotions]
                promo = [p[1] * 1000 for p in promotions]
                rows += [
                    (
                        "churn: real engine detection p50 / max",
                        f"{statistics.median(detect):.0f} / {max(detect):.0f} ms",
                    ),
                    (
                        "churn: real engine promotion p50 / p95 / max",
                        f"{statistics.median(promo):.0f} / {pct(promo, 0.95):.0f} / {max(promo):.0f} ms",
                    ),
                ]
            rows.append(("hollow fleet requests (leases, statuses)", f"{fleet.writes}"))
            rows.append(("hollow daemon endpoint requests", f"{fleet.daemons.requests}"))
            rows.append(("machine load at end (1/5/15 min)", " ".join(f"{x:.2f}" for x in os.getloadavg())))
        finally:
            fleet.stop()
            width = max(len(r[0]) for r in rows)
            print(f"| {'measure':<{width}} | value |\n|{'-' * (width + 2)}|-------|")
            for name, value in rows:
                print(f"| {name:<{width}} | {value} |", flush=True)


if __name__ == "__main__":
    main()
