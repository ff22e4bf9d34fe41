"""The peers file (plan/seeding.py) names a daemon pod only when a starting daemon could copy every
rank from it: Ready, of the generation the spec wants, its report ready with each rank's weights
digest. Each peer says its node, its pod IP, the seed port and, per global rank, that digest and
the rank's local index in the pod (its port offset)."""

from __future__ import annotations

from daemon_reports import rank, report
from seed_world import CACHE, full, gpu_nodes, seed_daemon, world
from weightcache_contract.seeding import SEED_PORT, SeedPeer
from weightcache_operator.plan.seeding import seed_peers


def test_a_ready_daemon_of_the_current_generation_with_a_full_report_is_a_peer() -> None:
    snapshot, reports = world([(seed_daemon("node-a", "10.0.0.1"), full())], gpu_nodes("node-a"))

    peers = seed_peers(CACHE, snapshot, reports)

    assert peers.peers == [
        SeedPeer(
            node="node-a",
            address="10.0.0.1",
            port=SEED_PORT,
            ranks={0: "0" * 64, 1: "1" * 64},
            local_index={0: 0, 1: 1},
        )
    ]


def test_old_generation_unready_pods_and_incomplete_reports_are_not_peers() -> None:
    snapshot, reports = world(
        [
            (seed_daemon("node-a", "10.0.0.1", spec_hash="old-generation"), full()),
            (seed_daemon("node-b", "10.0.0.2", ready=False), full()),
            (seed_daemon("node-c", "10.0.0.3"), report(rank(0), rank(1, ready=False))),
            (seed_daemon("node-d", "10.0.0.4"), report(rank(0), rank(1, fingerprint=None))),
            (seed_daemon("node-e", "10.0.0.5"), "GET http://10.0.0.5:9400/status: refused"),
            (seed_daemon("node-f", "10.0.0.6"), full()),
        ],
        gpu_nodes("node-a", "node-b", "node-c", "node-d", "node-e", "node-f"),
    )

    peers = seed_peers(CACHE, snapshot, reports)

    assert [p.node for p in peers.peers] == ["node-f"]


def test_a_daemon_whose_report_was_never_read_is_not_a_peer() -> None:
    snapshot, _ = world([(seed_daemon("node-a", "10.0.0.1"), full())], gpu_nodes("node-a"))

    assert seed_peers(CACHE, snapshot, {}).peers == []
