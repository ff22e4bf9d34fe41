"""Failover benchmark: the active engine killed again and again under steady load, on the real
control plane and the process kubelet (cpu-shm backend, one replica with one hot standby), for
one engine profile: ``--engine reference`` runs the README sample (examples/weightcache-cpu.yaml,
the reference engine), ``--engine vllm`` examples/weightcache-vllm-cpu.yaml (``vllm serve`` with
the weightcache plug-in; needs vLLM in the environment, as ``make demo ENGINE=vllm``).

An open-loop client starts a request every ``--interval`` seconds through a kube-proxy-like proxy
of the Service (testcluster.serviceproxy), each on its own thread with its own ``--timeout``,
whatever the earlier ones are doing: a request stuck on a frozen engine delays no other, so
"the first successful request sent after the kill" means what it says. Each request is tried
once more after ``--retry-delay`` seconds if it fails; "failed, no retry" counts first attempts
that failed, "failed, retry once" requests whose retry failed too. The rate must stay below what
the engine serves on the machine as loaded (an overloaded engine answers 429 and its queue
grows): the report's latency line for requests between kills says whether it did. Each kill
cycles through SIGKILL of the engine's processes, deletion of its pod and a readiness failure
(SIGSTOP of its processes, so /ready times out, thawed once the failover is done); the
``+daemon`` runs also SIGKILL the daemon container on the active engine's node at the same
moment. A freeze is heard by the operator's own probes (``--unresponsive-ms``, default 400: the
frozen active is demoted and kept) or, with 0, by the kubelet's readiness probe alone (the frozen
active is retired). Per kill:

- detection: the kill → the start of the operator's pass that promoted (``status.lastFailover.time``;
  same host clock): more than the status's own ``detectionMs``, which starts at the operator's
  first sight of the failure, after the kubelet and the watch;
- promotion: that pass's start → the standby's relabel patched (``status.lastFailover.promotionMs``);
- endpoint: the kill → the proxy routing to the new active;
- first success: the kill → the earliest end of a request (first attempt or retry) sent after
  the kill that succeeded.

Between kills, while the new active serves and nothing is being killed, a prober also GETs the
active engine's readiness path (its probe's: ``/ready``, vLLM's ``/health``) directly every 100
ms: the latency a healthy, loaded engine answers its readiness with is what ``--unresponsive-ms`` must stay above; the Failover events counted at the
end against the kills show whether a healthy active was ever judged silent.

It is a script, not a test: it prints a table and asserts nothing. Needs the e2e cluster build
(tests/cluster/build.sh, cached) and runs as root like the e2e tests.

    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/failover.py --kills 21 --daemon-kills 9
    PYTHONPATH=contract:daemon_image:operator:tests/cluster .venv/bin/python benchmarks/failover.py --engine vllm --kills 9 --daemon-kills 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from sample_cluster import NS, sample, sample_cluster
from testcluster.kubelet import ProcessKubelet
from testcluster.load import OpenLoopLoad as Load
from testcluster.rest import Kube
from testcluster.sample import SAMPLE, VLLM_SAMPLE, converged, daemons_of, engines_of
from testcluster.serviceproxy import ServiceProxy
from testcluster.waiting import wait_for
from weightcache_operator.render.warm import WARM_CONTAINER

EXAMPLES = {"reference": SAMPLE, "vllm": VLLM_SAMPLE}
"""The example each engine profile's run applies."""


@dataclass(frozen=True)
class Target:
    """The cache under test, by the example its run applies."""

    name: str
    port: int

    @classmethod
    def of(cls, body: dict) -> Target:
        return cls(body["metadata"]["name"], int(body["spec"]["engine"].get("port", 8000)))

    @property
    def path(self) -> str:
        return f"/apis/weightcache.io/v1alpha1/namespaces/{NS}/weightcaches/{self.name}"

    @property
    def engines(self) -> str:
        return engines_of(self.name)

    @property
    def daemons(self) -> str:
        return daemons_of(self.name)

    def prompt(self) -> dict:
        """What a client sends: the served name (the cache's), a short prompt, two tokens."""
        return {"model": self.name, "prompt": "The weight cache", "max_tokens": 2, "temperature": 0}


@dataclass
class ReadyProber:
    """GETs the serving engine's readiness ``path`` directly every ``interval`` s; keeps (start,
    latency s or None for a failure) per sample. Only samples inside ``windows`` (a healthy active, nothing
    being killed) are reported."""

    proxy: ServiceProxy
    path: str = "/ready"
    interval: float = 0.1
    timeout: float = 5.0
    samples: list[tuple[float, float | None]] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> ReadyProber:
        threading.Thread(target=self._run, daemon=True, name="ready-prober").start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def healthy(self) -> list[float | None]:
        return [
            latency
            for at, latency in self.samples
            if any(a <= at and at + (latency or self.timeout) <= b for a, b in self.windows)
        ]

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            endpoints = self.proxy.ready_endpoints
            if len(endpoints) != 1:
                continue
            started = time.time()
            try:
                with urllib.request.urlopen(f"http://{endpoints[0]}{self.path}", timeout=self.timeout) as response:
                    latency: float | None = time.time() - started if response.status == 200 else None
            except Exception:  # noqa: BLE001 - a failed probe is a sample too
                latency = None
            self.samples.append((started, latency))


@dataclass
class Kill:
    kind: str
    daemon: bool
    at: float
    same_node: bool
    detection_s: float | None = None
    promotion_s: float | None = None
    endpoint_s: float | None = None
    first_ok_s: float | None = None
    first_served_s: float | None = None
    """How long the new active took over the first request sent to it after the switch that it
    answered: the "hot" in hot standby, against the steady latency line."""
    signal: str | None = None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=sorted(EXAMPLES), default="reference", help="the engine profile to run")
    parser.add_argument("--kills", type=int, default=21, help="kills of the active engine alone")
    parser.add_argument("--daemon-kills", type=int, default=9, help="kills of the active engine and its node's daemon")
    parser.add_argument(
        "--interval",
        type=float,
        default=0.1,
        help="seconds between request starts (open loop; keep it below what the engine serves, see the steady latency line)",
    )
    parser.add_argument("--retry-delay", type=float, default=0.3)
    parser.add_argument("--timeout", type=float, default=5.0, help="client timeout per attempt (s)")
    parser.add_argument(
        "--unresponsive-ms",
        type=int,
        default=400,
        help="spec.engine.failover.unresponsiveAfterMilliseconds (0: the kubelet's probe alone hears a freeze)",
    )
    options = parser.parse_args()

    example = EXAMPLES[options.engine]
    with sample_cluster("weightcache-failover-bench-", example=example) as cluster:
        body = sample(example)
        target = Target.of(body)
        body["spec"]["engine"].setdefault("failover", {})["unresponsiveAfterMilliseconds"] = options.unresponsive_ms
        cluster.apply(body)
        wait_whole(cluster.kube, target, cluster.operator, 900)
        proxy = ServiceProxy(cluster.kube, NS, target.name, target.port).start()
        load = prober = None
        try:
            proxy.wait_for_ready(1)
            load = Load(proxy.address, options.interval, options.retry_delay, options.timeout, target.prompt()).start()
            prober = ReadyProber(proxy, readiness_path(cluster.kube, target)).start()
            time.sleep(2)
            kinds = itertools.cycle(["SIGKILL", "delete", "readiness"])
            kills: list[Kill] = []
            for daemon, count in ((False, options.kills), (True, options.daemon_kills)):
                load.phases.append(time.time())
                for _ in range(count):
                    kills.append(
                        one_kill(
                            cluster.kube,
                            target,
                            cluster.kubelet,
                            proxy,
                            load,
                            prober,
                            cluster.operator,
                            next(kinds),
                            daemon,
                        )
                    )
                    print(f"{len(kills):3d} {kills[-1]}", flush=True)
            print(f"engine profile: {options.engine} ({example.name})")
            report(kills, load, prober, options)
            keep_warm(cluster.kube, target)
            recorded = failover_events(cluster.kube)
            print(
                f"failovers recorded (Failover events): {recorded} for {len(kills)} kills; "
                f"unresponsiveAfterMilliseconds {options.unresponsive_ms}"
            )
        finally:
            if prober:
                prober.stop()
            if load:
                load.stop()
            proxy.stop()


def keep_warm(kube: Kube, target: Target) -> None:
    """What the warm sidecars say: requests sent and how long the engine took over the last one,
    the engine time keep-warm costs per interval."""
    for pod in kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=target.engines)["items"]:
        warm = next((c for c in pod["spec"]["containers"] if c["name"] == WARM_CONTAINER), None)
        if warm is None or not pod["status"].get("podIP"):
            continue
        url = f"http://{pod['status']['podIP']}:{warm['ports'][0]['containerPort']}/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            said = json.loads(response.read())
        role = pod["metadata"]["labels"].get("weightcache.io/role")
        print(
            f"warm sidecar of {pod['metadata']['name']} ({role}): {said['warmed']} requests served, "
            f"{said['failures']} failed, last took {said['lastSeconds']:.3f} s"
        )


def failover_events(kube: Kube) -> int:
    """Failovers the operator announced: more than the kills means it failed over a healthy
    active (a wrong ``Unresponsive`` verdict shows here)."""
    events = kube.get(f"/api/v1/namespaces/{NS}/events")["items"]
    return sum(e.get("count", 1) for e in events if e.get("reason") == "Failover")


def wait_whole(kube: Kube, target: Target, operator: subprocess.Popen, timeout: float = 300) -> dict:
    """The cache Ready with its active and one Ready standby; returns the status."""

    def ready() -> dict | None:
        assert operator.poll() is None, "the operator exited"
        status = kube.get(target.path).get("status") or {}
        engines = status.get("engines") or [{}]
        ok = converged(status) and len(engines[0].get("standbys") or []) == 1
        return status if ok else None

    return wait_for(
        ready, timeout, interval=0.2, describe=lambda: json.dumps(kube.get(target.path).get("status"))[-2000:]
    )


def readiness_path(kube: Kube, target: Target) -> str:
    """The path of the engine container's readinessProbe (``/ready``, vLLM's ``/health``)."""
    pod = kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=target.engines)["items"][0]
    engine = next(c for c in pod["spec"]["containers"] if c["name"] == "engine")
    return str(engine["readinessProbe"]["httpGet"]["path"])


def container_pgid(kubelet: ProcessKubelet, pod: str, container: str | None = None) -> int:
    worker = kubelet.pod_worker(NS, pod)
    assert worker is not None
    runner = next(r for r in worker.runners if container in (None, r.name))
    assert runner.process is not None
    return runner.process.pid


def one_kill(
    kube: Kube,
    target: Target,
    kubelet: ProcessKubelet,
    proxy: ServiceProxy,
    load: Load,
    prober: ReadyProber,
    operator: subprocess.Popen,
    kind: str,
    daemon: bool,
) -> Kill:
    status = wait_whole(kube, target, operator, 600)
    wait_for(lambda: len(proxy.ready_endpoints) == 1, 30)
    time.sleep(1.0)  # steady state: the load is served by the active before the kill
    active, standby = status["engines"][0]["active"], status["engines"][0]["standbys"][0]
    pods = {
        p["metadata"]["name"]: p
        for p in kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=target.engines)["items"]
    }
    node = pods[active]["spec"]["nodeName"]
    standby_ip = pods[standby]["status"]["podIP"]
    daemon_pgid = None
    if daemon:
        daemon_pod = next(
            p
            for p in kube.get(f"/api/v1/namespaces/{NS}/pods", labelSelector=target.daemons)["items"]
            if p["spec"]["nodeName"] == node
        )
        daemon_pgid = container_pgid(kubelet, daemon_pod["metadata"]["name"], "daemon")
    pgid = container_pgid(kubelet, active, "engine")
    previous = (status.get("lastFailover") or {}).get("time")
    kill = Kill(kind, daemon, time.time(), pods[standby]["spec"]["nodeName"] == node)
    if prober.windows and prober.windows[-1][1] == float("inf"):
        prober.windows[-1] = (prober.windows[-1][0], kill.at)
    if daemon_pgid is not None:
        os.killpg(daemon_pgid, signal.SIGKILL)
    if kind == "SIGKILL":
        os.killpg(pgid, signal.SIGKILL)
    elif kind == "delete":
        kube.delete(f"/api/v1/namespaces/{NS}/pods/{active}")
    else:
        os.killpg(pgid, signal.SIGSTOP)
    try:
        last = wait_for(
            lambda: (f := kube.get(target.path).get("status", {}).get("lastFailover")) and f["time"] != previous and f,
            120,
            interval=0.05,
            describe="no failover recorded",
        )
        wait_for(lambda: proxy.ready_endpoints == (f"{standby_ip}:{target.port}",), 120, interval=0.01)
        switched = next(
            (
                c.observed_at
                for c in proxy.changes
                if c.observed_at >= kill.at and c.ready == (f"{standby_ip}:{target.port}",)
            ),
            None,
        )
        wait_for(lambda: any(a.ok and a.started >= kill.at for a in load.done()), 120, interval=0.02)
        # From a second after the switch the new active is healthy until the next kill.
        prober.windows.append(((switched or time.time()) + 1.0, float("inf")))
    finally:
        if kind == "readiness":
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    # Earliest end among the successes so far: a request still in flight can only end later.
    first = min((a for a in load.done() if a.ok and a.started >= kill.at), key=lambda a: a.ended)
    noticed = datetime.fromisoformat(last["time"].replace("Z", "+00:00")).timestamp()
    kill.signal = last.get("signal")
    kill.detection_s = noticed - kill.at
    kill.promotion_s = last["promotionMs"] / 1000
    kill.endpoint_s = None if switched is None else switched - kill.at
    kill.first_ok_s = first.ended - kill.at
    after = [a for a in load.done() if a.ok and switched is not None and a.started >= switched]
    if after:
        earliest = min(after, key=lambda a: a.started)
        kill.first_served_s = earliest.ended - earliest.started
    return kill


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(kills: list[Kill], load: Load, prober: ReadyProber, options: argparse.Namespace) -> None:
    print()
    print("| kills | metric | p50 | p95 | max |")
    print("| --- | --- | --- | --- | --- |")
    for label, group in (
        ("engine", [k for k in kills if not k.daemon]),
        ("engine + daemon", [k for k in kills if k.daemon]),
    ):
        if not group:
            continue
        for metric in ("detection_s", "promotion_s", "endpoint_s", "first_ok_s", "first_served_s"):
            values = [getattr(k, metric) * 1000 for k in group if getattr(k, metric) is not None]
            if values:
                print(
                    f"| {label} ({len(group)}) | {metric[:-2].replace('_', ' ')} ms | {statistics.median(values):.0f} | "
                    f"{pct(values, 0.95):.0f} | {max(values):.0f} |"
                )
    for label, group in (
        ("engine", [k for k in kills if not k.daemon]),
        ("engine + daemon", [k for k in kills if k.daemon]),
    ):
        for metric in ("first_ok_s", "endpoint_s"):
            by_kind: dict[str, list[float]] = {}
            for k in group:
                if getattr(k, metric) is not None:
                    by_kind.setdefault(k.kind, []).append(getattr(k, metric) * 1000)
            print(
                f"{label}: {metric[:-2].replace('_', ' ')} ms by kind: "
                + ", ".join(
                    f"{kind} p50 {statistics.median(v):.0f} max {max(v):.0f} (n={len(v)})"
                    for kind, v in by_kind.items()
                )
            )
        print(f"{label}: standby on the active's node in {sum(k.same_node for k in group)}/{len(group)}")
    bounds = [*load.phases, float("inf")]
    for label, start, end in zip(("engine", "engine + daemon"), bounds, bounds[1:]):
        mine = [a for a in load.done() if start <= a.started < end]
        first = [a for a in mine if not a.retry]
        print(
            f"{label}: requests {len(first)}; failed without retry {sum(not a.ok for a in first)}; "
            f"failed with one retry after {options.retry_delay} s {sum(not a.ok for a in mine if a.retry)}; "
            f"failures by error {dict(Counter(a.error for a in mine if not a.ok))}"
        )
    steady = [
        (a.ended - a.started) * 1000
        for a in load.done()
        if not a.retry and any(w0 <= a.started and a.ended <= w1 for w0, w1 in prober.windows)
    ]
    if steady:
        print(
            f"requests between kills (healthy active): {len(steady)}, latency ms p50 {statistics.median(steady):.0f} "
            f"p99 {pct(steady, 0.99):.0f} max {max(steady):.0f}"
        )
    healthy = prober.healthy()
    answered = [x * 1000 for x in healthy if x is not None]
    if answered:
        print(
            f"/ready of the healthy active, every 100 ms: {len(healthy)} samples, {len(healthy) - len(answered)} failed; "
            f"latency ms p50 {statistics.median(answered):.0f} p99 {pct(answered, 0.99):.0f} "
            f"p99.9 {pct(answered, 0.999):.0f} max {max(answered):.0f}"
        )
    print("signals recorded:", {s: sum(k.signal == s for k in kills) for s in sorted({str(k.signal) for k in kills})})


if __name__ == "__main__":
    main()
