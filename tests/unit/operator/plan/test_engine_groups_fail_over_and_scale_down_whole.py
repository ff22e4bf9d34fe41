"""parallelism.nodes > 1: a failed active group is replaced by the standby group whole, named by
its member's failure, and scaling down deletes whole groups."""

from __future__ import annotations

import copy

from builders import make
from group_builders import READY, TWO, complete_groups, daemon, failovers, ids, plan_groups, readiness_failed
from weightcache_operator.plan.actions import Create, Delete, Failover, SetRole


def test_a_failed_active_group_is_a_failover_named_by_its_members_failure() -> None:
    """What status.lastFailover, the Event and the metrics get: the groups' leaders and the signal."""
    cache = make(**TWO)
    pods = complete_groups(cache)
    # A member exited for good: the group goes whole, the standby group takes over.
    exited = copy.deepcopy(pods)
    exited[1]["status"]["phase"] = "Failed"
    assert failovers(plan_groups(cache, exited, READY, ids())) == [("tiny-0-gb-0", "tiny-0-ga-0", "PodFailed")]
    # The leader is being deleted: it names the failure and the group; its follower goes with it.
    deleted = copy.deepcopy(pods)
    deleted[0]["metadata"]["deletionTimestamp"] = "2026-11-29T10:01:00Z"
    plan = plan_groups(cache, deleted, READY, ids())
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-0", "PodDeleted")]
    assert [a.name for a in plan if isinstance(a, Delete)] == ["tiny-0-ga-1"]
    assert [a.promotion.failure.since for a in plan if isinstance(a, Failover)][0] is not None
    # Every pod of the failed group goes with the promotion: the failure was first seen with the first of them.
    failed_pods = [a.promotion.failed_pods for a in plan if isinstance(a, Failover)][0]
    assert [p["metadata"]["name"] for p in failed_pods] == ["tiny-0-ga-0", "tiny-0-ga-1"]
    # A member's node turned NotReady (its pods still look Ready): over at once, the group retired
    # and a new standby group asked for. Here both groups span node-2, so only with a third node.
    dead = copy.deepcopy(pods)
    for member in dead[2:]:
        member["spec"]["nodeName"] = {"node-1": "node-3", "node-2": "node-4"}[member["spec"]["nodeName"]]
    ready = {0: {**READY[0], "node-3": daemon("node-3", 0)}, 1: {**READY[1], "node-4": daemon("node-4", 1)}}
    plan = plan_groups(cache, dead, ready, ids(), {"node-2": None})
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-0", "NodeNotReady")]
    assert sorted(a.name for a in plan if isinstance(a, Delete)) == ["tiny-0-ga-0", "tiny-0-ga-1"]
    assert [a.pod["metadata"]["labels"]["weightcache.io/role"] for a in plan if isinstance(a, Create)] == ["standby"]
    assert failovers(plan_groups(cache, pods, READY, ids(), {"node-2": None})) == [], "no healthy group to take over"
    # A readiness failure after the group had been Ready: swapped and named.
    frozen = readiness_failed(pods[:2]) + copy.deepcopy(pods[2:])
    plan = plan_groups(cache, frozen, READY, ids())
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-0", "ReadinessFailed")]
    # A group that never got Ready swapped for a Ready one is a promotion with no failure (logged,
    # not counted: report.failover); a converged one has none.
    swap = plan_groups(cache, complete_groups(cache, ready_active=False), READY, ids())
    assert failovers(swap) == [("tiny-0-gb-0", "tiny-0-ga-0", None)]
    assert failovers(plan_groups(cache, pods, READY, ids())) == []


def test_failover_swaps_whole_groups_and_scaling_down_deletes_whole_groups() -> None:
    cache = make(**TWO)
    plan = plan_groups(cache, complete_groups(cache, ready_active=False), READY, ids())
    roles = {a.name: a.role for a in plan if isinstance(a, SetRole)}
    assert roles == {
        "tiny-0-gb-0": "active",
        "tiny-0-gb-1": "active",
        "tiny-0-ga-0": "standby",
        "tiny-0-ga-1": "standby",
    }

    fewer = make(**TWO, **{"engine.standbysPerReplica": 0})
    plan = plan_groups(fewer, complete_groups(fewer), READY, ids())
    assert sorted(a.name for a in plan if isinstance(a, Delete)) == ["tiny-0-gb-0", "tiny-0-gb-1"]
    assert plan_groups(
        make(**TWO, **{"engine.replicas": 0, "engine.standbysPerReplica": 0}), complete_groups(cache), READY, ids()
    ) == [Delete(n, "scaled down") for n in ("tiny-0-ga-0", "tiny-0-ga-1", "tiny-0-gb-0", "tiny-0-gb-1")]
