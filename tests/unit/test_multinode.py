"""parallelism.nodes > 1: the rank → node mapping, per-slot daemons, engine groups and their plan."""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from typing import Any

import builders
from builders import NOW, condition, container_status, make, node, scheduled
from test_render import container, env_of
from test_rollout import daemonsets_deleted
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import ApplyService, Create, Delete, Failover, SetRole, in_order
from weightcache_operator.plan.engine_plan import EnginePlan, desired, plan_engines
from weightcache_operator.plan.engine_units import units
from weightcache_operator.plan.rollout import planner
from weightcache_operator.plan.rollout.status import rollout_status
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import (
    SPEC_HASH_ANNOTATION,
    daemon_spec_hash,
    engine_pod,
    engine_service,
    engine_template_hash,
)
from weightcache_operator.render.daemon import daemon_daemonset, daemon_daemonsets, slot_base
from weightcache_operator.render.engine import Member
from weightcache_operator.render.topology import assign_slots, selected
from weightcache_operator.spec import Placement

TWO = {"parallelism.tensor": 2, "parallelism.nodes": 2}


# --- mapping -----------------------------------------------------------------------------------


def test_slots_are_assigned_by_sorted_name_in_groups_of_nodes() -> None:
    topo = assign_slots(["n-c", "n-a", "n-e", "n-b", "n-d"], 2)
    assert topo.slots == [["n-a", "n-c"], ["n-b", "n-d"]] and topo.idle == ["n-e"]
    assert topo.slot_of("n-d") == 1 and topo.slot_of("n-e") is None
    assert assign_slots(["n-b", "n-a"], 2) == assign_slots(["n-a", "n-b", "n-a"], 2), (
        "order and duplicates do not matter"
    )
    assert assign_slots(["n-a"], 2).slots == [[], []]
    assert assign_slots(["x", "y", "z"], 1).slots == [["x", "y", "z"]]


def test_node_selection_follows_selector_affinity_and_taints() -> None:
    placement = Placement.model_validate(
        {
            "nodeSelector": {"pool": "gpu"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["special"]}
                                ]
                            },
                        ]
                    }
                }
            },
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }
    )
    assert selected(placement, node("a", labels={"pool": "gpu", "zone": "a"}))
    assert selected(placement, node("special", labels={"pool": "gpu"})), "second term (hostname)"
    assert not selected(placement, node("c", labels={"pool": "gpu", "zone": "c"}))
    assert not selected(placement, node("d", labels={"pool": "cpu", "zone": "a"}))
    assert selected(
        placement, node("e", labels={"pool": "gpu", "zone": "b"}, taints=[{"key": "gpu", "effect": "NoSchedule"}])
    )
    assert not selected(
        placement, node("f", labels={"pool": "gpu", "zone": "b"}, taints=[{"key": "other", "effect": "NoExecute"}])
    )
    assert selected(
        placement,
        node("g", labels={"pool": "gpu", "zone": "b"}, taints=[{"key": "other", "effect": "PreferNoSchedule"}]),
    )
    assert selected(Placement(), node("h")), "no placement: every node"


# --- daemons -----------------------------------------------------------------------------------


def test_one_daemonset_per_slot_pinned_to_its_nodes_holding_its_ranks() -> None:
    cache = make(**{"parallelism.tensor": 4, "parallelism.nodes": 2})
    sets = daemon_daemonsets(cache, [["node-1", "node-3"], ["node-2", "node-4"]])
    assert [ds["metadata"]["name"] for ds in sets] == ["tiny-daemon-0", "tiny-daemon-1"]
    for slot, ds in enumerate(sets):
        cmd = container(ds, "daemon")["command"]
        assert cmd[cmd.index("--ranks") + 1] == ["0-1", "2-3"][slot] and cmd[cmd.index("--tp-size") + 1] == "4"
        assert container(ds, "daemon")["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "status"}
        assert ds["spec"]["selector"]["matchLabels"]["weightcache.io/slot"] == str(slot)
        assert ds["spec"]["template"]["metadata"]["labels"]["weightcache.io/slot"] == str(slot)
        pod = ds["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/hostname",
                        "operator": "In",
                        "values": [["node-1", "node-3"], ["node-2", "node-4"]][slot],
                    }
                ]
            }
        ]
        assert pod["nodeSelector"] == {"pool": "gpu"}, "the placement still applies"
    assert daemon_daemonsets(cache, [["node-1"], []]) == [daemon_daemonset(cache, 0, ["node-1"])], (
        "no nodes, no DaemonSet"
    )


def test_nodes_one_renders_as_before() -> None:
    cache = make()
    assert daemon_daemonsets(cache, []) == [daemon_daemonset(cache)]
    ds = daemon_daemonset(cache)
    assert (
        ds["metadata"]["name"] == "tiny-daemon" and "weightcache.io/slot" not in ds["spec"]["selector"]["matchLabels"]
    )
    assert "affinity" not in ds["spec"]["template"]["spec"]
    assert "weightcache.io/node-rank" not in engine_service(cache)["spec"]["selector"]


# --- engine pods -------------------------------------------------------------------------------


def test_group_members_get_node_rank_rendezvous_and_shared_labels() -> None:
    cache = make(**TWO)
    leader = engine_pod(cache, 0, "standby", ["node-1"], member=Member("abc123", 0, port=29501))
    follower = engine_pod(cache, 0, "standby", ["node-2"], member=Member("abc123", 1, "198.18.1.7", port=29501))
    assert (leader["metadata"]["name"], follower["metadata"]["name"]) == ("tiny-0-abc123-0", "tiny-0-abc123-1")
    for pod, rank in ((leader, "0"), (follower, "1")):
        labels = pod["metadata"]["labels"]
        assert labels["weightcache.io/engine-group"] == "abc123" and labels["weightcache.io/node-rank"] == rank
        assert labels["weightcache.io/role"] == "standby" and pod["spec"]["readinessGates"]
        env = env_of(container(pod, "engine"))
        assert env["WEIGHTCACHE_ENGINE_NNODES"] == "2" and env["WEIGHTCACHE_ENGINE_NODE_RANK"] == rank
        assert env["WEIGHTCACHE_ENGINE_TP_SIZE"] == "2"
    assert env_of(container(leader, "engine"))["WEIGHTCACHE_ENGINE_DIST_ADDR"] == "$(POD_IP):29501"
    assert env_of(container(follower, "engine"))["WEIGHTCACHE_ENGINE_DIST_ADDR"] == "198.18.1.7:29501"
    assert "readinessProbe" in container(leader, "engine") and "ports" in container(leader, "engine")
    assert "readinessProbe" not in container(follower, "engine"), "a follower serves no HTTP"
    assert engine_service(cache)["spec"]["selector"]["weightcache.io/node-rank"] == "0", "leaders only"


def test_engine_pod_refuses_inconsistent_membership() -> None:
    import pytest

    with pytest.raises(ValueError, match="member"):
        engine_pod(make(**TWO), 0, "active")
    with pytest.raises(ValueError, match="member"):
        engine_pod(make(), 0, "active", member=Member("g", 0))
    with pytest.raises(ValueError, match="leader's pod IP"):
        engine_pod(make(**TWO), 0, "active", member=Member("g", 1))


# --- the plan ----------------------------------------------------------------------------------


def daemon(node_name: str, slot: int, **fields: Any) -> dict[str, Any]:
    """The daemon pod of node slot ``slot`` on ``node_name``, the rest as ``builders.daemon`` takes
    it; ``engine_plan`` makes it Ready and of the cache's generation."""
    return builders.daemon(f"d-{node_name}", node=node_name, slot=slot, **fields)


READY = {0: {"node-1": daemon("node-1", 0)}, 1: {"node-2": daemon("node-2", 1)}}


def run(pod: dict[str, Any], node_name: str, ip: str | None = None, ready: bool = False) -> dict[str, Any]:
    """A created pod as the API server would return it once scheduled (and running)."""
    return scheduled(pod, node=node_name, ip=ip, ready=ready)


def readiness_failed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's pods, Ready turned False (NOW+300) after their containers had started (NOW+1): ReadinessFailed."""
    out = copy.deepcopy(pods)
    for pod in out:
        pod["status"]["containerStatuses"] = [container_status("engine", started=1)]
        pod["status"]["conditions"] = [condition("Ready", False, since=300)]
    return out


def ids() -> Any:
    counter = itertools.count()
    return lambda: f"g{next(counter)}"


def engine_plan(
    cache: Any,
    pods: list[dict[str, Any]],
    ready: dict[int, dict[str, dict[str, Any]]],
    new_group: Any,
    unready_nodes: dict[str, None] | None = None,
    serving: str | None = None,
    unresponsive: dict[str, datetime] | None = None,
    now: datetime = NOW,
    cordoned: list[str] | tuple[str, ...] = (),
) -> EnginePlan:
    """The one planner's plan for a cache whose slot ``k`` daemons are Ready on the nodes of
    ``ready[k]``, with ``unready_nodes`` NotReady, ``cordoned`` nodes unschedulable and the
    Service on ``serving`` (default: the current generation)."""
    daemons = []
    for slot in ready.values():
        for pod in slot.values():
            pod = copy.deepcopy(pod)
            pod["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
            pod["status"] = {**pod["status"], "conditions": [{"type": "Ready", "status": "True"}]}
            daemons.append(pod)
    nodes = [node(name, ready=False) for name in unready_nodes or {}] + [
        node(name, unschedulable=True, ready=True) for name in cordoned
    ]
    body = {"metadata": {"name": cache.metadata["name"], "namespace": "ns"}, "status": {}}
    state = Snapshot(
        body,
        cache,
        nodes=nodes,
        daemon_pods=daemons,
        engine_pods=list(pods),
        service=engine_service(cache, serving or daemon_spec_hash(cache)),
    )
    return plan_engines(
        cache, state, desired(cache), now, apply_service=False, unresponsive=unresponsive, new_group=new_group
    )


def plan_groups(
    cache: Any,
    pods: list[dict[str, Any]],
    ready: dict[int, dict[str, dict[str, Any]]],
    new_group: Any,
    unready_nodes: dict[str, None] | None = None,
    serving: str | None = None,
) -> list[Any]:
    """``engine_plan``'s engine actions (the Service's left out)."""
    plan = engine_plan(cache, pods, ready, new_group, unready_nodes, serving)
    return [a for a in plan.actions if not isinstance(a, ApplyService)]


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


def complete_groups(cache: Any, ready_active: bool = True, ready_standby: bool = True) -> list[dict[str, Any]]:
    pods = []
    for group, role, ready in (("ga", "active", ready_active), ("gb", "standby", ready_standby)):
        ip = "198.18.1.5" if group == "ga" else "198.18.1.6"
        pods.append(run(engine_pod(cache, 0, role, ["node-1"], member=Member(group, 0)), "node-1", ip, ready))
        pods.append(
            run(engine_pod(cache, 0, role, ["node-2"], member=Member(group, 1, ip)), "node-2", "198.18.2.5", ready)
        )
    return pods


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


def failovers(plan: list[Any]) -> list[tuple[str, str | None, str | None]]:
    """(to, from, signal) of each Failover action."""
    return [
        (
            a.promotion.promoted["metadata"]["name"],
            a.promotion.failed["metadata"]["name"] if a.promotion.failed else None,
            a.promotion.failure.signal if a.promotion.failure else None,
        )
        for a in plan
        if isinstance(a, Failover)
    ]


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


def test_dra_groups_share_the_claim_of_the_daemon_on_their_node() -> None:
    body_changes = {**TWO, "daemon.backend": "cuda-vmm", "engine.gpuAccess": "dra", "engine.standbysPerReplica": 0}
    cache = make(**body_changes)
    ready = copy.deepcopy(READY)
    for slot, node_name in ((0, "node-1"), (1, "node-2")):
        ready[slot][node_name]["status"]["resourceClaimStatuses"] = [
            {"name": "gpus", "resourceClaimName": f"c-{node_name}"}
        ]
    [leader] = [a.pod for a in plan_groups(cache, [], ready, ids()) if isinstance(a, Create)]
    assert leader["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-node-1"}]
    running = run(leader, "node-1", "198.18.1.5")
    [follower] = [a.pod for a in plan_groups(cache, [running], ready, ids()) if isinstance(a, Create)]
    assert follower["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-node-2"}]
    # node-2's daemon was replaced (a new claim): the group is stale and goes whole.
    ready[1]["node-2"]["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "c-node-2-new"
    plan = plan_groups(cache, [running, run(follower, "node-2", "198.18.2.5")], ready, ids())
    assert {a.name for a in plan if isinstance(a, Delete)} == {"tiny-0-g0-0", "tiny-0-g0-1"}


# --- status ------------------------------------------------------------------------------------


def test_status_counts_groups_and_lists_slot_ranks() -> None:
    cache = make(**{"parallelism.tensor": 4, "parallelism.nodes": 2})
    daemons = [
        builders.daemon(
            f"tiny-daemon-{slot}-x", node=node_name, slot=slot, spec_hash=daemon_spec_hash(cache), ready=True
        )
        for slot, node_name in ((0, "node-1"), (1, "node-2"))
    ]
    pods = complete_groups(cache, ready_standby=False)
    status = aggregate(cache, Observed(daemons, pods, 2), NOW)
    assert [n["ranks"] for n in status["nodes"]] == [
        [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}],
        [{"rank": 2, "ready": True}, {"rank": 3, "ready": True}],
    ]
    assert status["engines"] == [{"replica": 0, "active": "tiny-0-ga-0", "standbys": ["tiny-0-gb-0"]}]
    assert (status["activeEngines"], status["standbyEngines"], status["phase"]) == (1, 0, "Loading")
    # A group missing its follower is not a ready engine, even with a Ready leader.
    lone = [p for p in complete_groups(cache) if p["metadata"]["name"] != "tiny-0-gb-1"]
    assert aggregate(cache, Observed(daemons, lone, 2), NOW)["standbyEngines"] == 0
    assert [u.complete for u in units(lone, 2)] == [True, False]


def test_a_new_engine_version_rolls_through_group_by_group() -> None:
    """The old groups serve until a whole new-version group is Ready; then it takes over and the
    old groups are drained, and a new-version standby group follows."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]})
    old = complete_groups(old_cache)
    first = plan_groups(new_cache, old, READY, ids())
    assert [type(a) for a in first] == [Create], first
    surge = first[0].pod  # type: ignore[union-attr]
    assert surge["metadata"]["labels"]["weightcache.io/role"] == "standby"
    assert (
        surge["metadata"]["labels"]["weightcache.io/engine-hash"]
        != old[0]["metadata"]["labels"]["weightcache.io/engine-hash"]
    )
    leader = run(surge, "node-1", ip="198.18.1.7")
    group = leader["metadata"]["labels"]["weightcache.io/engine-group"]
    follower = plan_groups(new_cache, [*old, leader], READY, ids())
    assert len(follower) == 1 and isinstance(follower[0], Create)
    member = run(follower[0].pod, "node-2", "198.18.2.7")
    assert plan_groups(new_cache, [*old, leader, member], READY, ids()) == [], "waits for the new group to be Ready"
    # The old active fails meanwhile: the old standby group takes over, not the unready new one.
    failing = complete_groups(old_cache, ready_active=False)
    roles = {
        a.name: a.role
        for a in plan_groups(new_cache, [*failing, leader, member], READY, ids())
        if isinstance(a, SetRole)
    }
    assert roles["tiny-0-gb-0"] == "active" and f"tiny-0-{group}-0" not in roles
    ready_group = [
        run(surge, "node-1", "198.18.1.7", ready=True),
        run(follower[0].pod, "node-2", "198.18.2.7", ready=True),
    ]
    switch = plan_groups(new_cache, [*old, *ready_group], READY, ids())
    assert {a.name for a in switch if isinstance(a, SetRole) and a.role == "active"} == {
        p["metadata"]["name"] for p in ready_group
    }
    assert sorted(a.name for a in switch if isinstance(a, Delete)) == [
        "tiny-0-ga-0",
        "tiny-0-ga-1",
        "tiny-0-gb-0",
        "tiny-0-gb-1",
    ]
    assert all("rolled out" in a.why for a in switch if isinstance(a, Delete))
    promoted = [copy.deepcopy(p) for p in ready_group]
    for pod in promoted:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    restore = plan_groups(new_cache, promoted, READY, ids())
    assert [(type(a), a.pod["metadata"]["labels"]["weightcache.io/role"]) for a in restore] == [(Create, "standby")]  # type: ignore[union-attr]


def test_group_rollout_reports_progress_stalls_past_the_deadline_and_completes() -> None:
    """status.rollout for engine groups: what planner.plan tells rollout_status at each stage."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]})
    want = Desired(
        engine_template_hash(new_cache), daemon_spec_hash(new_cache), replicas=1, standbys=1, ready_deadline_s=600
    )
    at = lambda minutes: datetime(2026, 11, 29, 10, minutes, tzinfo=UTC)  # noqa: E731  (pods: 10:00)
    old = complete_groups(old_cache)
    assert planner.plan(want, complete_groups(new_cache), [], None, at(1), size=2).phase is None, (
        "nothing to roll, nothing rolled"
    )

    started = planner.plan(want, old, [], None, at(1), size=2)
    assert (started.mode, started.phase, started.updated) == ("Engine", "Progressing", 0)
    assert started.step == "replica 0: starting a new-version standby"

    [surge] = [a.pod for a in plan_groups(new_cache, old, READY, ids()) if isinstance(a, Create)]
    leader = run(surge, "node-1", ip="198.18.1.7")
    [member] = [
        run(a.pod, "node-2", "198.18.2.7")
        for a in plan_groups(new_cache, [*old, leader], READY, ids())
        if isinstance(a, Create)
    ]
    waiting = planner.plan(want, [*old, leader, member], [], None, at(5), size=2)
    assert waiting.phase == "Progressing"
    assert waiting.step == f"replica 0: waiting for {leader['metadata']['name']} to turn Ready"
    stalled = planner.plan(want, [*old, leader, member], [], None, at(11), size=2)
    assert stalled.phase == "Stalled" and stalled.stalled is not None
    assert f"engine group {leader['metadata']['name']}" in stalled.stalled
    assert "readyDeadlineSeconds is 600" in stalled.stalled
    status = rollout_status(stalled, want, at(11), rollout_status(started, want, at(1), None))
    assert status is not None and (status["phase"], status["startedAt"]) == ("Stalled", "2026-11-29T10:01:00Z")
    assert status["message"] == stalled.stalled

    ready_group = [run(surge, "node-1", "198.18.1.7", ready=True), run(member, "node-2", "198.18.2.7", ready=True)]
    for pod in ready_group:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    draining = copy.deepcopy(old)
    for pod in draining:
        pod["metadata"]["deletionTimestamp"] = "2026-11-29T10:12:00Z"
    assert (
        planner.plan(want, [*draining, *ready_group], [], None, at(12), size=2).step
        == "replica 0: waiting for old engines to finish draining"
    )
    previous = {"phase": "Progressing", "mode": "Engine"}
    restoring = planner.plan(want, ready_group, [], None, at(13), previous, size=2)
    assert (restoring.phase, restoring.updated) == ("Progressing", 0), "no Ready new standby group yet"
    standby = [copy.deepcopy(p) for p in ready_group]
    for pod, name in zip(standby, ("tiny-0-gz-0", "tiny-0-gz-1")):
        pod["metadata"]["name"] = name
        pod["metadata"]["labels"]["weightcache.io/role"] = "standby"
        pod["metadata"]["labels"]["weightcache.io/engine-group"] = "gz"
    done = planner.plan(want, [*ready_group, *standby], [], None, at(14), previous, size=2)
    assert (done.phase, done.mode, done.updated, done.step) == ("Complete", "Engine", 1, "every replica updated")


def test_a_blue_green_generation_change_of_groups_switches_the_service_a_pass_after_the_promotion() -> None:
    """New weights (a new daemon generation) for engine groups: a new slot DaemonSet set next to
    the old one, a new group promoted next to the old active — which keeps serving — and only
    once the new group is labelled active does the Service switch, then the old groups drain and
    the old slot DaemonSets go."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"model.revision": "r2"})
    old_gen, new_gen = daemon_spec_hash(old_cache), daemon_spec_hash(new_cache)
    assert old_gen != new_gen
    sets = daemon_daemonsets(new_cache, [["node-1"], ["node-2"]], name=f"tiny-daemon-{new_gen[:10]}")
    assert [ds["metadata"]["name"] for ds in sets] == [f"tiny-daemon-{new_gen[:10]}-0", f"tiny-daemon-{new_gen[:10]}-1"]
    assert {slot_base(ds) for ds in sets} == {f"tiny-daemon-{new_gen[:10]}"}

    want = Desired(engine_template_hash(new_cache), new_gen, replicas=1, standbys=1, ready_deadline_s=600)
    old = complete_groups(old_cache)
    old_sets = {"tiny-daemon-0": old_gen, "tiny-daemon-1": old_gen}
    at = datetime(2026, 11, 29, 10, 5, tzinfo=UTC)
    [surge] = [a.pod for a in plan_groups(new_cache, old, READY, ids(), serving=old_gen) if isinstance(a, Create)]
    fresh = [run(surge, "node-1", "198.18.1.7", ready=True)]
    fresh.append(
        run(
            next(
                a.pod
                for a in plan_groups(new_cache, [*old, *fresh], READY, ids(), serving=old_gen)
                if isinstance(a, Create)
            ),
            "node-2",
            "198.18.2.7",
            ready=True,
        )
    )
    # Ready but a standby: the Service stays on the old generation; the new group is promoted
    # while the old active keeps its label and serves.
    progress = planner.plan(want, [*old, *fresh], [], old_gen, at, None, 0, old_sets, size=2)
    assert progress.serve_hash == old_gen and daemonsets_deleted(progress) == []
    plan = plan_groups(new_cache, [*old, *fresh], READY, ids(), serving=progress.serve_hash)
    assert {a.name: a.role for a in plan if isinstance(a, SetRole)} == {p["metadata"]["name"]: "active" for p in fresh}
    assert not [a for a in plan if isinstance(a, Delete)], "the old groups serve until the Service switches"

    promoted = copy.deepcopy(fresh)
    for pod in promoted:
        pod["metadata"]["labels"]["weightcache.io/role"] = "active"
    # Next pass: the new group is active and Ready, so the Service switches; the old groups drain.
    progress = planner.plan(want, [*old, *promoted], [], old_gen, at, None, 0, old_sets, size=2)
    assert progress.serve_hash == new_gen and daemonsets_deleted(progress) == [], "old engines still map it"
    plan = plan_groups(new_cache, [*old, *promoted], READY, ids(), serving=progress.serve_hash)
    assert sorted(a.name for a in plan if isinstance(a, Delete)) == [
        "tiny-0-ga-0",
        "tiny-0-ga-1",
        "tiny-0-gb-0",
        "tiny-0-gb-1",
    ]
    # The old active group leaves the Service only after the Service selects the new generation.
    steps = [type(a).__name__ for a in in_order([ApplyService(new_gen), *plan])]
    assert steps.index("ApplyService") < steps.index("Delete")
    # The old engines are gone: their slot DaemonSets go too.
    done = planner.plan(
        want, promoted, [], new_gen, at, {"phase": "Progressing", "mode": "Generation"}, 0, old_sets, size=2
    )
    assert sorted(daemonsets_deleted(done)) == ["tiny-daemon-0", "tiny-daemon-1"]
    # Without a pending switch (an engine-only rollout) promotion and retirement are one pass.
    assert any(isinstance(a, Delete) for a in plan_groups(new_cache, [*old, *fresh], READY, ids()))


def test_planning_groups_leaves_the_pods_it_is_given_as_they_were() -> None:
    cache = make(**TWO)
    swapped = complete_groups(cache, ready_active=False)  # the plan promotes one group, demotes the other
    given = copy.deepcopy(swapped)
    plan = plan_groups(cache, swapped, READY, ids())
    assert any(isinstance(a, SetRole) for a in plan)
    assert swapped == given
