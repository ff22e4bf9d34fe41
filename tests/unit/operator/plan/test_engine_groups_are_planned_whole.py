"""parallelism.nodes > 1: the one engine planner starts a group leader first, its followers once
the leader has an IP, and treats a group as one engine: converged, it plans nothing; its leader
lost, the group goes whole."""

from __future__ import annotations

import copy

from builders import make
from group_builders import READY, TWO, complete_groups, failovers, ids, plan_groups, run
from rendered import container, env_of
from weightcache_operator.plan.actions import Create, Delete, SetRole


def test_groups_start_leader_first_then_followers_dial_its_ip() -> None:
    cache = make(**TWO)  # 1 replica + 1 standby
    first = plan_groups(cache, [], READY, ids())
    assert all(isinstance(a, Create) for a in first) and len(first) == 2
    leaders = [a.pod for a in first if isinstance(a, Create)]
    assert [p["metadata"]["labels"]["weightcache.io/role"] for p in leaders] == ["active", "standby"]
    assert [p["metadata"]["labels"]["weightcache.io/node-rank"] for p in leaders] == ["0", "0"]
    assert [p["metadata"]["annotations"]["weightcache.io/dist-port"] for p in leaders] == ["29500", "29501"]
    assert plan_groups(cache, [], {0: READY[0]}, ids()) == [], "no group starts while a slot has no ready daemon"

    # The leaders are scheduled but have no IP yet: nothing to do. Then one gets its IP.
    pods = [run(leaders[0], "node-1"), run(leaders[1], "node-1")]
    assert plan_groups(cache, pods, READY, ids()) == []
    pods[0] = run(leaders[0], "node-1", ip="198.18.1.5")
    followers = plan_groups(cache, pods, READY, ids())
    assert len(followers) == 1 and isinstance(followers[0], Create)
    pod = followers[0].pod
    assert pod["metadata"]["name"] == "tiny-0-g0-1" and pod["metadata"]["labels"]["weightcache.io/role"] == "active"
    assert env_of(container(pod, "engine"))["WEIGHTCACHE_ENGINE_DIST_ADDR"] == "198.18.1.5:29500"
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"][-1]["values"] == ["node-2"], "slot 1's pod goes where slot 1's ranks are"


def test_a_new_group_never_takes_the_port_of_a_group_still_terminating() -> None:
    cache = make(**TWO)
    leaders = [a.pod for a in plan_groups(cache, [], READY, ids()) if isinstance(a, Create)]
    pods = [run(leaders[0], "node-1", ip="198.18.1.5"), run(leaders[1], "node-1", ip="198.18.1.6")]
    # The standby group's leader is being deleted: its ranks keep port 29501 until they exit.
    pods[1]["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:05Z"
    created = [a.pod for a in plan_groups(cache, pods, READY, ids()) if isinstance(a, Create)]
    new_leaders = [p for p in created if p["metadata"]["labels"]["weightcache.io/node-rank"] == "0"]
    assert [p["metadata"]["annotations"]["weightcache.io/dist-port"] for p in new_leaders] == ["29502"]


def test_a_converged_layout_plans_nothing_and_a_lost_leader_takes_its_group() -> None:
    cache = make(**TWO)
    pods = complete_groups(cache)
    assert plan_groups(cache, pods, READY, ids()) == []

    # The active group's leader is gone: its follower goes, the standby group is promoted whole,
    # and a new standby group starts.
    without_leader = [p for p in pods if p["metadata"]["name"] != "tiny-0-ga-0"]
    plan = plan_groups(cache, without_leader, READY, ids())
    assert Delete("tiny-0-ga-1", "the group's leader is gone") in plan
    assert {a.name for a in plan if isinstance(a, SetRole) and a.role == "active"} == {"tiny-0-gb-0", "tiny-0-gb-1"}
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-1", "PodGone")]
    created = [a.pod for a in plan if isinstance(a, Create)]
    assert len(created) == 1 and created[0]["metadata"]["labels"]["weightcache.io/role"] == "standby"


def test_planning_groups_leaves_the_pods_it_is_given_as_they_were() -> None:
    cache = make(**TWO)
    swapped = complete_groups(cache, ready_active=False)  # the plan promotes one group, demotes the other
    given = copy.deepcopy(swapped)
    plan = plan_groups(cache, swapped, READY, ids())
    assert any(isinstance(a, SetRole) for a in plan)
    assert swapped == given
