"""Drains and dead nodes under seeding (plan/seeding.py): a peer on a cordoned node (the first step
of ``kubectl drain``) is listed after every other peer and in every assignment after the peers that
stay, so a new node does not start a seed from a machine about to go; it is still listed, for
ranks no other node holds. A daemon pod still marked Ready on a node that is not Ready is no peer:
asking it would cost each starting daemon a stall before the disk."""

from __future__ import annotations

from seed_world import CACHE, full, gpu_nodes, seed_daemon, world
from weightcache_operator.plan.seeding import seed_peers

SEEDS = [
    (seed_daemon("node-a", "10.0.0.1"), full()),
    (seed_daemon("node-b", "10.0.0.2"), full()),
    (seed_daemon("node-c", "10.0.0.3"), full()),
]


def test_a_cordoned_peer_is_every_new_node_s_last_choice() -> None:
    snapshot, reports = world(SEEDS, gpu_nodes("node-a", "node-b", "node-c", "new-1", "new-2", cordoned=("node-a",)))

    peers = seed_peers(CACHE, snapshot, reports)

    assert [p.node for p in peers.peers] == ["node-b", "node-c", "node-a"]
    assert peers.assignments == {"new-1": ["node-b", "node-c", "node-a"], "new-2": ["node-c", "node-b", "node-a"]}


def test_a_cordoned_peer_still_seeds_when_it_is_the_only_one() -> None:
    snapshot, reports = world(SEEDS[:1], gpu_nodes("node-a", "new-1", cordoned=("node-a",)))

    assert seed_peers(CACHE, snapshot, reports).assignments == {"new-1": ["node-a"]}


def test_a_ready_daemon_on_a_node_that_is_not_ready_is_no_peer() -> None:
    snapshot, reports = world(SEEDS, gpu_nodes("node-a", "node-b", "node-c", "new-1", unready=("node-b",)))

    peers = seed_peers(CACHE, snapshot, reports)

    assert [p.node for p in peers.peers] == ["node-a", "node-c"]
    assert peers.assignments["new-1"] == ["node-a", "node-c"]
    assert "node-b" in peers.assignments, "its daemon counts as gone: the node is assigned seeds for its return"
