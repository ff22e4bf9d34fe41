"""Each node selected for the cache's daemons that has no Ready daemon yet is assigned the peers to
try, the first one rotating over the seeds: N new nodes start from M seeds round robin, in name
order, the same file whatever order the pods were listed in."""

from __future__ import annotations

from builders import node
from seed_world import CACHE, full, gpu_nodes, seed_daemon, world
from weightcache_operator.plan.seeding import seed_peers
from weightcache_operator.render.seeding import peers_json

SEEDS = [(seed_daemon("node-a", "10.0.0.1"), full()), (seed_daemon("node-b", "10.0.0.2"), full())]


def test_four_new_nodes_take_two_seeds_in_turn() -> None:
    snapshot, reports = world(SEEDS, gpu_nodes("node-a", "node-b", "new-1", "new-2", "new-3", "new-4"))

    assignments = seed_peers(CACHE, snapshot, reports).assignments

    assert assignments == {
        "new-1": ["node-a", "node-b"],
        "new-2": ["node-b", "node-a"],
        "new-3": ["node-a", "node-b"],
        "new-4": ["node-b", "node-a"],
    }


def test_the_file_is_the_same_whatever_order_the_pods_come_in() -> None:
    nodes = gpu_nodes("node-a", "node-b", "new-1", "new-2", "new-3")
    one, reports = world(SEEDS, nodes)
    other, _ = world(list(reversed(SEEDS)), list(reversed(nodes)))

    assert peers_json(seed_peers(CACHE, one, reports)) == peers_json(seed_peers(CACHE, other, reports))


def test_nodes_the_placement_does_not_select_and_nodes_with_a_ready_daemon_get_no_assignment() -> None:
    snapshot, reports = world(SEEDS, [*gpu_nodes("node-a", "node-b", "new-1"), node("cpu-1", labels={"pool": "cpu"})])

    assert list(seed_peers(CACHE, snapshot, reports).assignments) == ["new-1"]


def test_without_a_seed_new_nodes_get_no_assignment() -> None:
    snapshot, reports = world([], gpu_nodes("new-1", "new-2"))

    peers = seed_peers(CACHE, snapshot, reports)

    assert peers.peers == [] and peers.assignments == {}
