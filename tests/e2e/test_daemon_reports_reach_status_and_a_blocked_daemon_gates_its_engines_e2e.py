"""What each daemon reports reaches status.nodes and the operator's metrics; a daemon whose rank is
frozen takes the daemon-ready gate and the Service's traffic from the engines on its node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from operator_e2e import PROMPT, apply_sample, gate, http_json, http_text, is_ready, metric, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, ENGINES, events, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_daemon_reports_reach_status_and_a_blocked_daemon_gates_its_engines(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """The operator fills status.nodes from each daemon pod's status endpoint and exports its own
    metrics; a daemon whose rank is frozen (SIGSTOP: its probe stops answering) turns NotReady,
    the engines on its node lose the daemon-ready gate and their Ready, and the Service sends
    nothing there (after the 1 s daemon outage grace this test sets: the engines there are Ready
    and would ride out a shorter outage); thawed, everything is Ready again."""
    apply_sample(cluster, namespace, engine__failover={"daemonOutageGraceSeconds": 1})
    reported = lambda s: all(n.get("fingerprint") for n in s.get("nodes", [])) and len(s.get("nodes", [])) == 2  # noqa: E731
    status = wait_phase(kube, namespace, operator, "Ready", also=reported)

    def socket_dir(node: str) -> Path:
        return (
            kubelet.node_root(node)
            / "run"
            / "weightcache"
            / f"{namespace}-tiny-llama"
            / status["daemonSpecHash"]
            / "tiny-llama"
        )

    daemons = {p["spec"]["nodeName"]: p for p in pods(kube, namespace, DAEMONS)}
    for entry in status["nodes"]:
        pod = daemons[entry["node"]]
        assert entry["daemonPod"] == pod["metadata"]["name"] and "reportError" not in entry, entry
        own = http_json(f"http://{pod['status']['podIP']}:9400/status", timeout=10)  # what the daemon says itself
        assert entry["fingerprint"] == own["fingerprint"] and own["ready"]
        for rank in entry["ranks"]:
            held = json.loads((socket_dir(entry["node"]) / f"rank-{rank['rank']}.ready").read_text())
            assert rank["ready"] and rank["bytes"] == held["arena_bytes"] > 0, (rank, held)
            assert (
                rank["loadSeconds"] == held["load_seconds"] and rank["source"] == "disk" and rank["diskBytesRead"] > 0
            )
            assert "gpuUuid" not in rank, "cpu-shm holds no GPU"

    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    assert metric(scraped, "weightcache_operator_caches", phase="Ready") >= 1
    assert (
        metric(scraped, "weightcache_operator_reconcile_total", namespace=namespace, cache="tiny-llama", outcome="ok")
        > 0
    )
    assert metric(scraped, "weightcache_operator_reconcile_seconds_count", namespace=namespace, cache="tiny-llama") > 0
    assert metric(scraped, "weightcache_operator_engines", namespace=namespace, cache="tiny-llama", role="active") == 1
    # Where passes spend their time: every pass observed and reported, and each request it sent
    # is timed by verb (the cache's status patched; its pods listed at least once, by the first
    # pass, before the watch holds them). Every pass reads its pods once, from the watch or a LIST:
    # how many of each depends on when the watch caught up, so only their sum is pinned.
    passes = metric(scraped, "weightcache_operator_reconcile_seconds_count", namespace=namespace, cache="tiny-llama")
    assert metric(scraped, "weightcache_operator_pass_step_seconds_count", step="observe") >= passes
    assert metric(scraped, "weightcache_operator_pass_step_seconds_count", step="status") >= 1
    assert metric(scraped, "weightcache_operator_api_request_seconds_count", verb="LIST") >= 1
    pod_reads = sum(
        metric(scraped, "weightcache_operator_pod_reads_total", source=source) for source in ("watch", "list")
    )
    assert pod_reads >= passes
    assert metric(scraped, "weightcache_operator_api_request_seconds_count", verb="PATCH") >= 1
    # The Events of the phases the cache went through were sent (off the passes) and counted.
    told = events(kube, namespace, "PhaseReady")
    scraped = http_text(operator.metrics_url)  # type: ignore[attr-defined]
    assert metric(scraped, "weightcache_operator_events_total", outcome="sent") >= len(told) >= 1
    # Passes after pod events read the pods from the watch; full passes LIST them.
    assert metric(scraped, "weightcache_operator_pod_reads_total", source="watch") >= 1
    assert metric(scraped, "weightcache_operator_pod_reads_total", source="list") >= 1

    # Freeze rank 0 of the daemon on the standby engine's node: its load is blocked mid-life.
    # (Not the active's node for its own sake: a Ready standby elsewhere would take over and the
    # active be retired — test_failover_e2e covers that.)
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(1)
    role = lambda p: p["metadata"]["labels"]["weightcache.io/role"]  # noqa: E731
    node = next(p for p in pods(kube, namespace, ENGINES) if role(p) == "standby")["spec"]["nodeName"]
    active_node = next(p for p in pods(kube, namespace, ENGINES) if role(p) == "active")["spec"]["nodeName"]
    frozen = json.loads((socket_dir(node) / "rank-0.ready").read_text())["pid"]
    on_node = lambda: [p for p in pods(kube, namespace, ENGINES) if p["spec"]["nodeName"] == node]  # noqa: E731
    node_ips = lambda: {p["status"].get("podIP") for p in on_node()}  # noqa: E731
    os.kill(frozen, signal.SIGSTOP)
    try:
        wait_for(
            lambda: not is_ready(kube.get(f"/api/v1/namespaces/{namespace}/pods/{daemons[node]['metadata']['name']}")),
            60,
            describe=f"the daemon on {node} stayed Ready",
        )
        wait_for(
            lambda: on_node() and all(gate(p) == "False" and not is_ready(p) for p in on_node()),
            30,
            describe=lambda: [(p["metadata"]["name"], p["status"].get("conditions")) for p in on_node()],
        )
        wait_for(
            lambda: not {e.rsplit(":", 1)[0] for e in proxy.ready_endpoints} & node_ips(),
            30,
            describe=lambda: (proxy.ready_endpoints, node_ips()),
        )
        own = http_json(f"http://{daemons[node]['status']['podIP']}:9400/status", timeout=10)
        assert [r["ready"] for r in own["ranks"]] == [False, True] and not own["ready"], own
        assert "socket does not answer" in own["ranks"][0]["problem"]
        # The active shares the frozen node: no Ready standby can take over, so Degraded. Else the
        # active on the other node serves: Ready, with DaemonsReady saying what is missing.
        if active_node == node:
            blocked = wait_phase(kube, namespace, operator, "Degraded")
        else:
            blocked = wait_phase(
                kube,
                namespace,
                operator,
                "Ready",
                whole=False,
                also=lambda s: any(c["type"] == "DaemonsReady" and c["status"] == "False" for c in s["conditions"]),
            )
        entry = next(n for n in blocked["nodes"] if n["node"] == node)
        assert [r["ready"] for r in entry["ranks"]] == [False, False], entry
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_phase(kube, namespace, operator, "Ready", also=reported)
    wait_for(
        lambda: all(gate(p) == "True" and is_ready(p) for p in pods(kube, namespace, ENGINES)),
        60,
        describe=lambda: [
            (p["metadata"]["name"], p["status"].get("conditions")) for p in pods(kube, namespace, ENGINES)
        ],
    )
    proxy.wait_for_ready(1)
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
