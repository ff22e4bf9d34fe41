"""A rank that asked peers for its bytes and loaded them from the disk after all is told as a Warning
Event ``SeedFellBack`` on the cache, naming its node, its rank and the reason: once per daemon pod and
rank, not on every pass; a daemon pod started again is another life, told again."""

from __future__ import annotations

from daemon_reports import rank, report
from pass_world import World
from weightcache_contract.daemon_report import DaemonReport
from weightcache_contract.seeding import SeedReport


def _rank1_fell_back(url: str, timeout_s: float) -> DaemonReport:
    fell_back = SeedReport(seconds=2.0, fallback="node-9: credential refused")
    return report(rank(0), rank(1, seed=fell_back))


def _told(world: World) -> list[str]:
    world.reconciler.events.flush(5)
    events = [world.api.stored("Event", n) for n in world.api.names("Event")]
    return sorted(e["message"] for e in events if e["reason"] == "SeedFellBack" and e["type"] == "Warning")


def test_each_fallback_is_one_warning_naming_node_rank_and_reason() -> None:
    world = World(fetch=_rank1_fell_back)
    world.run(apply=True)
    world.daemons_run()

    world.run()
    world.run()
    world.run(apply=True)

    told = _told(world)
    assert len(told) == 2
    assert all("rank 1" in m and "node-9: credential refused" in m for m in told)
    assert ["node node-1," in told[0], "node node-2," in told[1]] == [True, True]


def test_a_replaced_daemon_pod_that_falls_back_again_is_told_again() -> None:
    world = World(fetch=_rank1_fell_back)
    world.run(apply=True)
    world.daemons_run()
    world.run()

    world.api.remove("Pod", "tiny-daemon-node-1")
    world.daemons_run()
    world.run()

    assert len(_told(world)) == 3
