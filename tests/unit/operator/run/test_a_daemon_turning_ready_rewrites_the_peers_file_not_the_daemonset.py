"""The peers file follows the daemons as they turn Ready (plan/seeding.py), written only when it
changes; the daemon pod template never does: it mounts the file and names no checksum of it, so a
new Ready daemon rolls no other."""

from __future__ import annotations

import json

from daemon_reports import rank, report
from pass_world import World
from weightcache_contract.daemon_report import DaemonReport
from weightcache_contract.seeding import PEERS_FILE, SeedPeers


def _full(url: str, timeout_s: float) -> DaemonReport:
    return report(rank(0), rank(1))


def _peers(world: World) -> SeedPeers:
    return SeedPeers.model_validate(json.loads(world.api.stored("ConfigMap", "tiny-seed-peers")["data"][PEERS_FILE]))


def test_the_first_peers_file_is_empty_and_ready_daemons_are_listed_once_their_reports_are_read() -> None:
    world = World(fetch=_full)
    world.run(apply=True)
    assert _peers(world) == SeedPeers()
    template = world.api.stored("DaemonSet", "tiny-daemon")["spec"]["template"]

    world.daemons_run()
    world.run()  # reads the reports after planning: the file follows in the next pass (woken at once)
    world.run()

    assert [(p.node, p.address) for p in _peers(world).peers] == [("node-1", "10.0.2.1"), ("node-2", "10.0.2.2")]
    world.api.forget_writes()

    world.run(apply=True)

    assert ("apply", "ConfigMap", "tiny-seed-peers") not in world.api.steps()
    assert ("apply", "DaemonSet", "tiny-daemon") not in world.api.steps()
    assert world.api.stored("DaemonSet", "tiny-daemon")["spec"]["template"] == template
