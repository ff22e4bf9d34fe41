"""Failover on the real control plane and the process kubelet: every way an active engine can
fail leads to exactly one promotion of the Ready standby, the failed pod retired and a
replacement standby made (a frozen engine the operator's own probes hear first is demoted and
kept instead); the operator killed in the middle of a failover converges. A daemon
container that crashes and re-adopts its arena from the keeper takes no Ready engine out of the
Service (the gate's outage grace); a daemon that stays NotReady past the grace fails over.

One cache serves every signal in turn (an engine start costs most of the time here). Each step
asserts roles, status.lastFailover, the Failover event and the failovers_total metric, and
that a completion through the Service's proxy works afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from operator_e2e import GATE, PROMPT, by_role, http_json, http_text, is_ready, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import MERGE, Kube
from testcluster.sample import DAEMONS, ENGINES, NAME, engines_of, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def failovers(operator: subprocess.Popen, namespace: str) -> int:
    """weightcache_operator_failovers_total for the namespace, all signals together."""
    total = 0.0
    for line in http_text(operator.metrics_url).splitlines():  # type: ignore[attr-defined]
        if line.startswith("weightcache_operator_failovers_total{") and f'namespace="{namespace}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def failover_events(kube: Kube, namespace: str) -> int:
    events = kube.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return sum(e.get("count", 1) for e in events if e.get("reason") == "Failover")


def pod(kube: Kube, namespace: str, name: str) -> dict:
    return kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def engine_pgid(kubelet: ProcessKubelet, namespace: str, name: str) -> int:
    worker = kubelet.pod_worker(namespace, name)
    assert worker is not None and worker.runners[0].process is not None, f"{name} runs no engine process"
    return worker.runners[0].process.pid


def container_pgid(kubelet: ProcessKubelet, namespace: str, name: str, container: str) -> int:
    worker = kubelet.pod_worker(namespace, name)
    assert worker is not None, f"{name} is not running here"
    runner = next(r for r in worker.runners if r.name == container)
    assert runner.process is not None, f"{name}/{container} runs no process"
    return runner.process.pid


def first_sight(last: dict) -> float:
    """When the operator first saw the failure (epoch seconds): ``time`` less ``detectionMs``, both
    on the operator's clock, which here is the test's."""
    return datetime.fromisoformat(last["time"].replace("Z", "+00:00")).timestamp() - last["detectionMs"] / 1000


def gate_condition(pod: dict) -> dict:
    return next(c for c in pod["status"].get("conditions", []) if c["type"] == GATE)


def restarts(pod: dict, container: str) -> int:
    return next(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses", []) if c["name"] == container)


def alarm_passes(operator: subprocess.Popen) -> int:
    """Passes the operator ran because an alarm (gates kept through a daemon outage) was due."""
    lines = operator.log.read_text().splitlines()  # type: ignore[attr-defined]
    return sum(1 for line in lines if '"message": "alarm"' in line)


class Cache:
    """The one cache of the test and the steps every failover is checked with."""

    def __init__(
        self,
        kube: Kube,
        kubelet: ProcessKubelet,
        cluster: ControlPlane,
        namespace: str,
        operator: subprocess.Popen,
        proxy,
        name: str = NAME,
    ) -> None:  # type: ignore[no-untyped-def]
        self.kube, self.kubelet, self.cluster, self.namespace = kube, kubelet, cluster, namespace
        self.operator, self.proxy = operator, proxy
        self.name, self.engines = name, engines_of(name)
        self.promotions = 0  # by every operator of this test, as seen in status and events

    def roles(self, gone: str | None = None) -> tuple[str, str]:
        """The Ready active and its Ready standby (the cache is Ready), neither of them ``gone``."""
        status = wait_phase(
            self.kube,
            self.namespace,
            self.operator,
            "Ready",
            name=self.name,
            also=lambda s: (
                len(s["engines"][0]["standbys"]) == 1
                and gone not in (s["engines"][0]["active"], *s["engines"][0]["standbys"])
            ),
        )
        return status["engines"][0]["active"], status["engines"][0]["standbys"][0]

    def node_of(self, name: str) -> str:
        return pod(self.kube, self.namespace, name)["spec"]["nodeName"]

    def standby_elsewhere(self) -> tuple[str, str]:
        """Active and standby on different nodes (a daemon or node failure takes out both when
        they share one): cordons the active's node while the standby is replaced."""
        active, standby = self.roles()
        if self.node_of(active) != self.node_of(standby):
            return active, standby
        node = self.node_of(active)
        self.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": True}})
        try:
            self.kube.delete(f"/api/v1/namespaces/{self.namespace}/pods/{standby}")
            active, standby = self.roles(gone=standby)
        finally:
            self.kube.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": False}})
        assert self.node_of(active) != self.node_of(standby)
        return active, standby

    def fails_over(
        self, expected: str, inject: Callable[[str, str], None], after: Callable[[], None] = lambda: None
    ) -> dict:
        """Injects a failure of the active engine and checks the failover it must cause."""
        active, standby = self.roles()
        standby_ip = pod(self.kube, self.namespace, standby)["status"]["podIP"]
        counted, events = failovers(self.operator, self.namespace), failover_events(self.kube, self.namespace)
        injected = time.time()
        inject(active, standby)
        wait_for(
            lambda: by_role(self.kube, self.namespace, self.engines)["active"] == [standby],
            60,
            describe=lambda: by_role(self.kube, self.namespace, self.engines),
        )
        wait_for(
            lambda: self.proxy.ready_endpoints == (f"{standby_ip}:8000",),
            30,
            describe=lambda: self.proxy.ready_endpoints,
        )
        host, port = self.proxy.address
        assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
        after()
        # Whole again: the promoted standby active, a new standby Ready, the failed pod retired.
        status = wait_phase(
            self.kube,
            self.namespace,
            self.operator,
            "Ready",
            name=self.name,
            also=lambda s: (
                s["engines"][0]["active"] == standby
                and len(s["engines"][0]["standbys"]) == 1
                and s["engines"][0]["standbys"][0] not in (active, standby)
            ),
        )
        last = status["lastFailover"]
        assert (last["from"], last["to"], last["signal"], last["replica"]) == (active, standby, expected, 0), last
        assert last["promotionMs"] >= 0 and last["detectionMs"] >= 0
        # Timed from the operator's own sight of it, never from a stamp truncated to the second,
        # which can come up to a second before the failure itself.
        assert first_sight(last) >= injected - 0.002, (injected, last)
        wait_for(
            lambda: (
                active
                not in [
                    p["metadata"]["name"]
                    for p in pods(self.kube, self.namespace, self.engines)
                    if not p["metadata"].get("deletionTimestamp")
                ]
            ),
            30,
            describe=f"{active} was not retired",
        )
        # Exactly one promotion: one more in the metric and one more Failover event.
        assert failovers(self.operator, self.namespace) == counted + 1
        wait_for(
            lambda: failover_events(self.kube, self.namespace) == events + 1,
            10,
            describe=lambda: f"Failover events: {failover_events(self.kube, self.namespace)}, before {events}",
        )
        self.promotions += 1
        return last

    def unresponsive_swap(self, after_ms: int) -> None:
        """Freezes the active with ``unresponsiveAfterMilliseconds`` set and checks the swap."""
        wc = f"/apis/weightcache.io/v1alpha1/namespaces/{self.namespace}/weightcaches/tiny-llama"
        on = {"spec": {"engine": {"failover": {"unresponsiveAfterMilliseconds": after_ms}}}}
        generation = self.kube.patch(wc, on, content_type=MERGE)["metadata"]["generation"]
        wait_for(lambda: self.kube.get(wc)["status"].get("observedGeneration") == generation, 30)
        active, standby = self.roles()
        uid = pod(self.kube, self.namespace, active)["metadata"]["uid"]
        standby_ip = pod(self.kube, self.namespace, standby)["status"]["podIP"]
        counted, events = failovers(self.operator, self.namespace), failover_events(self.kube, self.namespace)
        pgid = engine_pgid(self.kubelet, self.namespace, active)
        os.killpg(pgid, signal.SIGSTOP)
        try:
            wait_for(
                lambda: by_role(self.kube, self.namespace)["active"] == [standby],
                60,
                describe=lambda: by_role(self.kube, self.namespace),
            )
            # The relabel comes first; the status is written at the end of the same pass.
            last = wait_for(
                lambda: (f := self.kube.get(wc)["status"].get("lastFailover") or {}).get("to") == standby and f,
                30,
                describe=lambda: self.kube.get(wc)["status"].get("lastFailover"),
            )
            assert (last["from"], last["to"], last["signal"]) == (active, standby, "Unresponsive"), last
            # Timed from the first probe it left unanswered: the silence the verdict waits for is in it.
            assert last["detectionMs"] >= after_ms and "failureApiSecond" not in last, last
            frozen = pod(self.kube, self.namespace, active)
            assert frozen["metadata"]["uid"] == uid and not frozen["metadata"].get("deletionTimestamp")
            assert frozen["metadata"]["labels"]["weightcache.io/role"] == "standby"
            wait_for(
                lambda: self.proxy.ready_endpoints == (f"{standby_ip}:8000",),
                30,
                describe=lambda: self.proxy.ready_endpoints,
            )
            host, port = self.proxy.address
            assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
        finally:
            os.killpg(pgid, signal.SIGCONT)
        wait_phase(
            self.kube,
            self.namespace,
            self.operator,
            "Ready",
            also=lambda s: s["engines"][0]["active"] == standby and s["engines"][0]["standbys"] == [active],
        )
        # (An engine retired by an earlier step may still be in its preStop sleep or drain.)
        live = [
            p["metadata"]["name"]
            for p in pods(self.kube, self.namespace, ENGINES)
            if not p["metadata"].get("deletionTimestamp")
        ]
        assert sorted(live) == sorted([active, standby]), live
        assert failovers(self.operator, self.namespace) == counted + 1
        wait_for(
            lambda: failover_events(self.kube, self.namespace) == events + 1,
            10,
            describe=lambda: f"Failover events: {failover_events(self.kube, self.namespace)}, before {events}",
        )
        self.promotions += 1
        off = {"spec": {"engine": {"failover": {"unresponsiveAfterMilliseconds": 0}}}}
        generation = self.kube.patch(wc, off, content_type=MERGE)["metadata"]["generation"]
        wait_for(lambda: self.kube.get(wc)["status"].get("observedGeneration") == generation, 30)
        assert self.roles() == (standby, active), "turning the probes on and off rolled the engines"


# Eight failovers, each waiting for a replacement standby to start (torch import and all): longer
# than the suite's default per-test limit on a loaded 2-core machine.
@pytest.mark.timeout(1800)
def test_every_failure_signal_promotes_once_and_the_operator_killed_mid_failover_converges(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    start_operator: Callable[..., subprocess.Popen],
    ready_sample: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    cache = Cache(kube, kubelet, cluster, namespace, operator, proxy)

    # 0. The daemon container on the active's node is SIGKILLed: the kubelet restarts it in the
    # same pod and it re-adopts its arena from the keeper sidecar. The engines there have mapped
    # their weights and keep serving: their gates stay True (DaemonOutage while the daemon is
    # NotReady), nothing leaves the Service's endpoints and nobody is promoted.
    active, standby = cache.roles()
    node = cache.node_of(active)
    daemon = next(p for p in pods(kube, namespace, DAEMONS) if p["spec"]["nodeName"] == node)
    daemon_name = daemon["metadata"]["name"]
    on_node = [name for name in (active, standby) if cache.node_of(name) == node]
    gates_before = {name: gate_condition(pod(kube, namespace, name)) for name in on_node}
    assert all(g["status"] == "True" for g in gates_before.values()), gates_before
    # The baseline is the active's endpoint, not the proxy's first view: when the standby turns
    # Ready a moment before the active, the operator swaps their roles (an active never Ready yet
    # gives way) and the EndpointSlice may still show the old active when the proxy starts.
    active_ip = pod(kube, namespace, active)["status"]["podIP"]
    wait_for(lambda: proxy.ready_endpoints == (f"{active_ip}:8000",), 30, describe=lambda: proxy.ready_endpoints)
    endpoints, changes = proxy.ready_endpoints, len(proxy.changes)
    counted = failovers(operator, namespace)
    os.killpg(container_pgid(kubelet, namespace, daemon_name, "daemon"), signal.SIGKILL)
    wait_for(
        lambda: not is_ready(pod(kube, namespace, daemon_name)),
        30,
        interval=0.05,
        describe=f"{daemon_name} stayed Ready",
    )
    wait_for(
        lambda: gate_condition(pod(kube, namespace, active))["reason"] == "DaemonOutage",
        30,
        interval=0.05,
        describe=lambda: gate_condition(pod(kube, namespace, active)),
    )
    wait_for(
        lambda: is_ready(p := pod(kube, namespace, daemon_name)) and restarts(p, "daemon") > restarts(daemon, "daemon"),
        120,
        describe=lambda: pod(kube, namespace, daemon_name)["status"],
    )
    assert pod(kube, namespace, daemon_name)["metadata"]["uid"] == daemon["metadata"]["uid"], "the same daemon pod"

    def readopted(s: dict) -> bool:
        return all(r.get("source") == "keeper" for n in s.get("nodes", []) if n["node"] == node for r in n["ranks"])

    wait_phase(kube, namespace, operator, "Ready", also=readopted)
    for name, before in gates_before.items():
        after = gate_condition(pod(kube, namespace, name))
        assert (after["status"], after["reason"], after["lastTransitionTime"]) == (
            "True",
            "DaemonReady",
            before["lastTransitionTime"],
        )
    assert proxy.changes[changes:] == [] and proxy.ready_endpoints == endpoints, proxy.changes[changes:]
    assert by_role(kube, namespace)["active"] == [active] and failovers(operator, namespace) == counted
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]

    # 1. The engine's processes are SIGKILLed: its container restarts in place, Ready drops.
    cache.fails_over(
        "ContainerRestarted", lambda active, _: os.killpg(engine_pgid(kubelet, namespace, active), signal.SIGKILL)
    )

    # 2. The pod is deleted.
    cache.fails_over("PodDeleted", lambda active, _: kube.delete(f"/api/v1/namespaces/{namespace}/pods/{active}"))

    # 3. The engine stops answering /ready (frozen, not dead): the readiness probe fails.
    frozen: list[int] = []

    def freeze(active: str, _: str) -> None:
        frozen.append(engine_pgid(kubelet, namespace, active))
        os.killpg(frozen[0], signal.SIGSTOP)

    def thaw() -> None:  # so the retired pod's SIGTERM is handled and it stops at once
        try:
            os.killpg(frozen[0], signal.SIGCONT)
        except ProcessLookupError:
            pass

    cache.fails_over("ReadinessFailed", freeze, after=thaw)

    # 3b. The same freeze with the operator's own probes on (unresponsiveAfterMilliseconds): the
    # silence is heard before the kubelet's probe fails, the roles swap, and the frozen pod stays
    # as the standby (were it only slow, it would finish its requests and serve again). Thawed,
    # it is the Ready standby: nothing was deleted or created.
    cache.unresponsive_swap(500)

    # 4. The daemon on the active's node stays NotReady past the outage grace (frozen): the
    # operator turns the engines' gate False there. A 4 s grace keeps the test short; changing
    # it must roll no engine.
    active, standby = cache.standby_elsewhere()
    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama"
    grace = {"spec": {"engine": {"failover": {"daemonOutageGraceSeconds": 4}}}}
    generation = kube.patch(wc, grace, content_type=MERGE)["metadata"]["generation"]
    wait_for(lambda: kube.get(wc)["status"].get("observedGeneration") == generation, 30)
    assert cache.roles() == (active, standby), "a new grace rolled the engines"
    stopped: list[int] = []

    def stop_daemon(active: str, _: str) -> None:
        node = cache.node_of(active)
        [held] = (kubelet.node_root(node) / "run" / "weightcache" / f"{namespace}-tiny-llama").glob(
            "*/tiny-llama/rank-0.ready"
        )
        stopped.append(json.loads(held.read_text())["pid"])
        os.kill(stopped[0], signal.SIGSTOP)

    alarms_before = alarm_passes(operator)
    try:
        cache.fails_over("DaemonNotReady", stop_daemon, after=lambda: os.kill(stopped[0], signal.SIGCONT))
        # The gate kept through the outage was turned False by the pass scheduled at the grace's end.
        assert alarm_passes(operator) > alarms_before
    finally:
        if stopped:
            os.kill(stopped[0], signal.SIGCONT)
    wait_for(
        lambda: all(is_ready(p) for p in pods(kube, namespace, DAEMONS)),
        60,
        describe=lambda: [(p["metadata"]["name"], is_ready(p)) for p in pods(kube, namespace, DAEMONS)],
    )

    # 5. The active's node stops answering: NotReady (the operator watches nodes).
    cache.standby_elsewhere()
    failed_node: list[str] = []

    def fail_node(active: str, _: str) -> None:
        failed_node.append(cache.node_of(active))
        kubelet.fail_node(failed_node[0])

    try:
        last = cache.fails_over("NodeNotReady", fail_node)
        assert last["fromNode"] == failed_node[0] != last["toNode"]
    except BaseException:
        # What the failed node looked like before its recovery below changes it.
        for name in failed_node:
            node = kube.get(f"/api/v1/nodes/{name}")
            print(f"{name}: conditions {node['status'].get('conditions')}, taints {node['spec'].get('taints')}")
        raise
    finally:
        if failed_node:
            kubelet.recover_node(failed_node[0])
    wait_for(
        lambda: all(is_ready(p) for p in pods(kube, namespace, DAEMONS)) and len(pods(kube, namespace, DAEMONS)) == 2,
        120,
        describe=lambda: [(p["metadata"]["name"], is_ready(p)) for p in pods(kube, namespace, DAEMONS)],
    )

    # 6. The operator is SIGKILLed together with the deletion of the active engine (a deleted pod
    # never comes back, so the failover is left for sure to the next operator).
    active, standby = cache.roles()
    before = kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")["status"]
    operator.kill()
    operator.wait()
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{active}")
    # Higher priority than the dead one, whose peering entry lingers until it expires.
    cache.operator = operator = start_operator(priority=2_000_001)
    wait_for(lambda: by_role(kube, namespace)["active"] == [standby], 60, describe=lambda: by_role(kube, namespace))
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        also=lambda s: (
            s["engines"][0]["active"] == standby
            and len(s["engines"][0]["standbys"]) == 1
            and s["lastFailover"]["time"] != before["lastFailover"]["time"]
        ),
    )
    # The deleted pod may be gone before the new operator's first pass: then nothing names it.
    last = status["lastFailover"]
    assert last["to"] == standby and failovers(operator, namespace) == 1
    assert (last["signal"], last.get("from")) in (("PodDeleted", active), ("PodGone", None)), last

    # 7. Killed mid-failover: the standby relabelled active (a failover's first patch) but the
    # failed (frozen) active not yet retired. The next operator finishes the job without
    # promoting anyone else: exactly one active, the failed pod retired, a new standby.
    active, standby = cache.roles()
    operator.kill()
    operator.wait()
    pgid = engine_pgid(kubelet, namespace, active)
    os.killpg(pgid, signal.SIGSTOP)
    try:
        wait_for(lambda: not is_ready(pod(kube, namespace, active)), 30, describe=f"{active} stayed Ready")
        kube.patch(
            f"/api/v1/namespaces/{namespace}/pods/{standby}",
            {"metadata": {"labels": {"weightcache.io/role": "active"}}},
        )
        assert sorted(by_role(kube, namespace)["active"]) == sorted([active, standby])
        operator = start_operator(priority=3_000_001)
        wait_for(lambda: by_role(kube, namespace)["active"] == [standby], 60, describe=lambda: by_role(kube, namespace))
    finally:
        os.killpg(pgid, signal.SIGCONT)
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        also=lambda s: (
            s["engines"][0]["active"] == standby
            and len(s["engines"][0]["standbys"]) == 1
            and s["engines"][0]["standbys"][0] not in (active, standby)
        ),
    )
    assert failovers(operator, namespace) == 0, "the restarted operator promoted nobody"

    def live() -> list[str]:
        return [
            p["metadata"]["name"] for p in pods(kube, namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")
        ]

    assert sorted(live()) == sorted([standby, *status["engines"][0]["standbys"]])
    host, port = proxy.address
    wait_for(
        lambda: proxy.ready_endpoints == (f"{pod(kube, namespace, standby)['status']['podIP']}:8000",),
        30,
        describe=lambda: proxy.ready_endpoints,
    )
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
