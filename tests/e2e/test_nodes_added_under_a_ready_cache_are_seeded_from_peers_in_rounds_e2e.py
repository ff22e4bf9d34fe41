"""Nodes join a Ready cache's placement (what a scale-out or a replaced machine looks like): a first
new node's daemons copy both TP ranks from the Ready node's daemons with 0 checkpoint bytes read,
and three more joining at once are seeded in rounds, one of them from a node seeded a moment
before, while a client sends requests through the Service and none fails. The operator reports
each rank's source and peer in status.nodes. The added nodes leave the cluster afterwards."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from operator_e2e import apply_sample, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.kubelet.nodes import NodeSpec
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.sample import place_checkpoint

pytestmark = pytest.mark.e2e

SEED_S = 3.0
"""Roughly how long each seed takes under the test's serving cap: long enough that a second
starting node finds the first seed busy and a node seeded meanwhile listed."""


def ranks_by_node(status: dict) -> dict[str, list[dict]]:
    return {n["node"]: n["ranks"] for n in status.get("nodes", [])}


def seeded(status: dict, nodes: list[str]) -> bool:
    found = ranks_by_node(status)
    return all(n in found and found[n] and all(r.get("ready") and r.get("source") for r in found[n]) for n in nodes)


def test_nodes_added_under_a_ready_cache_are_seeded_from_peers_in_rounds(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    pool = {"weightcache.io/seed-pool": namespace[-40:]}
    names = [f"seed-{namespace[-5:]}-{i}" for i in range(1, 6)]
    joined: list[str] = []

    def join(*nodes: str) -> None:
        for node in nodes:
            place_checkpoint(checkpoint, [kubelet.node_root(node)])
            kubelet.add_node(NodeSpec(node, labels=pool))
            joined.append(node)

    try:
        join(names[0])
        apply_sample(
            cluster,
            namespace,
            placement__nodeSelector=pool,
            engine__standbysPerReplica=0,
            daemon__seeding={"maxClients": 1, "maxMiBPerSecond": 1.0, "stallSeconds": 5},
        )
        first = wait_phase(kube, namespace, operator, "Ready")
        assert {r["source"] for r in ranks_by_node(first)[names[0]]} == {"disk"}
        arena = max(r["bytes"] for r in ranks_by_node(first)[names[0]])
        # Paced so one seed takes ~SEED_S: the cap applies per rank.
        cap = arena / SEED_S / 2**20
        apply_sample(
            cluster,
            namespace,
            placement__nodeSelector=pool,
            engine__standbysPerReplica=0,
            daemon__seeding={"maxClients": 1, "maxMiBPerSecond": cap, "stallSeconds": 5, "minMiBPerSecond": 0.01},
        )
        proxy = service_proxy(namespace, "tiny-llama", 8000)
        # The proxy learns the Service's endpoints from its first listing: a request before that is
        # turned away (as by kube-proxy for a Service without endpoints), which is not the seeding's doing.
        proxy.wait_for_ready(1)
        load = SteadyLoad(*proxy.address).start()
        try:
            began = time.monotonic()
            join(names[1])
            one = wait_phase(kube, namespace, operator, "Ready", also=lambda s: seeded(s, names[:2]), timeout=180)
            first_round_s = time.monotonic() - began
            join(*names[2:])
            whole = wait_phase(kube, namespace, operator, "Ready", also=lambda s: seeded(s, names), timeout=300)
            rounds_s = time.monotonic() - began - first_round_s
        finally:
            result = load.stop()

        tree = {n: sorted({(r.get("source"), r.get("seedPeer")) for r in rs}) for n, rs in ranks_by_node(whole).items()}
        print(f"seeds: {tree}; first new node {first_round_s:.1f} s, three more {rounds_s:.1f} s; load: {result}")
        for node in names[1:]:
            for rank in ranks_by_node(whole)[node]:
                assert rank["source"] == "peer" and rank["diskBytesRead"] == 0, (node, rank)
                assert rank["seedPeer"] in names and rank["seedPeer"] != node and rank["seedBytes"] == rank["bytes"]
        assert {r["seedPeer"] for r in ranks_by_node(one)[names[1]]} == {names[0]}
        later = {r["seedPeer"] for node in names[2:] for r in ranks_by_node(whole)[node]}
        assert later - {names[0]}, f"every later node was seeded by the first: no rounds ({tree})"
        # A failure names its hop: the Service's ready endpoints as the proxy saw them change (an
        # empty set means the proxy turned clients away), beside each failed request's time.
        seen = [(time.strftime("%H:%M:%S", time.localtime(c.observed_at)), c.ready) for c in proxy.changes]
        assert result.ok > 0 and result.failed == [], (result.failed, seen)
    finally:
        cluster.kubectl("delete", "weightcache", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False)
        for node in joined:
            kubelet.remove_node(node)
