"""parallelism.nodes 2: engine groups spanning two nodes serve the disk completion through the
Service and fail over as a whole group."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from operator_e2e import PROMPT, apply_sample, gate, http_json, is_ready, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, ENGINES, events, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_tensor_parallel_over_two_nodes_serves_the_disk_completion(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    disk_completion: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    """parallelism.nodes 2: node-1 (slot 0) holds rank 0 and node-2 (slot 1) rank 1; each engine
    is a group of two pods (one per node) and the Service reaches the active group's leader."""
    apply_sample(cluster, namespace, parallelism__nodes=2)
    status = wait_phase(kube, namespace, operator, "Ready", timeout=480)

    daemons = {p["spec"]["nodeName"]: p for p in pods(kube, namespace, DAEMONS)}
    assert sorted(daemons) == ["node-1", "node-2"] and all(map(is_ready, daemons.values()))
    for node, rank in (("node-1", "0"), ("node-2", "1")):
        command = next(c for c in daemons[node]["spec"]["containers"] if c["name"] == "daemon")["command"]
        assert command[command.index("--ranks") + 1] == rank
        held = (
            kubelet.node_root(node)
            / "run"
            / "weightcache"
            / f"{namespace}-tiny-llama"
            / status["daemonSpecHash"]
            / "tiny-llama"
        )
        assert sorted(p.name for p in held.glob("*.ready")) == [f"rank-{rank}.ready"], "each node holds only its ranks"
    assert [(n["node"], [r["rank"] for r in n["ranks"]]) for n in status["nodes"]] == [("node-1", [0]), ("node-2", [1])]
    assert (status["readyNodes"], status["activeEngines"], status["standbyEngines"]) == ("2/2", 1, 1)

    engines = [p for p in pods(kube, namespace, ENGINES) if not p["metadata"].get("deletionTimestamp")]
    groups: dict[str, list[dict]] = {}
    for pod in engines:
        groups.setdefault(pod["metadata"]["labels"]["weightcache.io/engine-group"], []).append(pod)
    assert len(groups) == 2, [p["metadata"]["name"] for p in engines]
    roles = []
    for members in groups.values():
        placed = sorted((p["metadata"]["labels"]["weightcache.io/node-rank"], p["spec"]["nodeName"]) for p in members)
        assert placed == [("0", "node-1"), ("1", "node-2")], placed
        assert len({p["metadata"]["labels"]["weightcache.io/role"] for p in members}) == 1, "a group shares its role"
        assert all(is_ready(p) and gate(p) == "True" for p in members)
        roles.append(members[0]["metadata"]["labels"]["weightcache.io/role"])
    assert sorted(roles) == ["active", "standby"]

    leader = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/role"] == "active"
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "0"
    )
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    wait_for(
        lambda: proxy.ready_endpoints == (f"{leader['status']['podIP']}:8000",),
        30,
        describe=lambda: proxy.ready_endpoints,
    )
    host, port = proxy.address
    served = http_json(f"http://{host}:{port}/v1/completions", PROMPT)
    assert served["choices"][0]["text"] == disk_completion["choices"][0]["text"]
    assert served["choices"][0].get("token_ids") == disk_completion["choices"][0].get("token_ids")
    health = http_json(f"http://{host}:{port}/health")
    assert [(r["rank"], r["weights"]["mode"]) for r in health["ranks"]] == [(0, "cache"), (1, "cache")], health

    # The active group's node-rank-1 engine is SIGKILLed: the standby group takes over whole, and
    # the failover is recorded as for single-node engines (leaders as from/to, the signal, an Event).
    group = leader["metadata"]["labels"]["weightcache.io/engine-group"]
    follower = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/engine-group"] == group
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "1"
    )
    standby = next(
        p
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/role"] == "standby"
        and p["metadata"]["labels"]["weightcache.io/node-rank"] == "0"
    )
    worker = kubelet.pod_worker(namespace, follower["metadata"]["name"])
    assert worker is not None and worker.runners[0].process is not None
    os.killpg(worker.runners[0].process.pid, signal.SIGKILL)
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        timeout=300,
        also=lambda s: (s.get("lastFailover") or {}).get("to") == standby["metadata"]["name"],
    )
    last = status["lastFailover"]
    assert (last["from"], last["replica"]) == (leader["metadata"]["name"], 0), last
    assert last["signal"] in ("ContainerRestarted", "ReadinessFailed", "PodFailed"), last
    assert last["promotionMs"] >= 0 and last["toNode"] == "node-1"
    failovers = events(kube, namespace, "Failover")
    assert sum(e.get("count", 1) for e in failovers) == 1, failovers
    wait_for(
        lambda: proxy.ready_endpoints == (f"{standby['status']['podIP']}:8000",),
        60,
        describe=lambda: proxy.ready_endpoints,
    )
    assert (
        http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
        == disk_completion["choices"][0]["text"]
    )

    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=120s")
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
