"""parallelism.nodes > 1: status counts whole groups as engines and lists each node's slot ranks."""

from __future__ import annotations

import builders
from builders import NOW, make
from group_builders import complete_groups
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import daemon_spec_hash


def test_status_counts_groups_and_lists_slot_ranks() -> None:
    cache = make(**{"parallelism.tensor": 4, "parallelism.nodes": 2})
    daemons = [
        builders.daemon(
            f"tiny-daemon-{slot}-x", node=node_name, slot=slot, spec_hash=daemon_spec_hash(cache), ready=True
        )
        for slot, node_name in ((0, "node-1"), (1, "node-2"))
    ]
    pods = complete_groups(cache, ready_standby=False)
    status = aggregate(cache, Observed(daemons, pods, 2), NOW).wire()
    assert [n["ranks"] for n in status["nodes"]] == [
        [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}],
        [{"rank": 2, "ready": True}, {"rank": 3, "ready": True}],
    ]
    assert status["engines"] == [{"replica": 0, "active": "tiny-0-ga-0", "standbys": ["tiny-0-gb-0"]}]
    # The active group serves (Ready) while the standby's group is not whole (EnginesReady False).
    assert (status["activeEngines"], status["standbyEngines"], status["phase"]) == (1, 0, "Ready")
    assert next(c for c in status["conditions"] if c["type"] == "EnginesReady")["status"] == "False"
    # A group missing its follower is not a ready engine, even with a Ready leader.
    lone = [p for p in complete_groups(cache) if p["metadata"]["name"] != "tiny-0-gb-1"]
    assert aggregate(cache, Observed(daemons, lone, 2), NOW).wire()["standbyEngines"] == 0
    assert [u.complete for u in units(lone, 2)] == [True, False]
