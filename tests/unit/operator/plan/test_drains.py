"""Node drains: the disruption budget over the serving engines (render/budget.py), a cordoned
node read as the failure of the actives on it (failover.py), no new engine placed on one
(scaling.py), and a cordon that moves no daemon slot (render/topology.py)."""

from __future__ import annotations

import copy
from typing import Any

from builders import at, daemon, make, node
from group_builders import FOUR_NODES, TWO, engine_plan, failovers, group, ids, names
from replica_plans import Planned, plan_units, running_engine
from replica_plans import plan_replica as plan_pods
from weightcache_operator.observe.failures import cordoned_nodes, failure_of
from weightcache_operator.plan.actions import Create, Delete, SetRole
from weightcache_operator.plan.engine_units import units
from weightcache_operator.render import daemon_spec_hash, engine_service
from weightcache_operator.render.budget import engine_budget
from weightcache_operator.render.topology import CORDON_TAINT, selected
from weightcache_operator.spec import Placement

HASH = "h1"
DRAINED = frozenset({"node-1"})


def plan_replica(pods: list[dict[str, Any]], cordoned: frozenset[str] = DRAINED, **kw: Any) -> Planned:
    return plan_units(0, units(pods, 1), 1, HASH, kw.pop("unready", {}), None, (), cordoned)


# --- the budget ----------------------------------------------------------------------------------


def test_the_budget_selects_exactly_what_the_service_serves_and_admits_no_eviction_of_a_ready_active() -> None:
    cache = make(**{"engine.replicas": 3})
    budget = engine_budget(cache, "gen-a")
    assert (budget["apiVersion"], budget["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert budget["metadata"]["name"] == "tiny-active"
    assert budget["spec"]["selector"]["matchLabels"] == engine_service(cache, "gen-a")["spec"]["selector"]
    assert budget["spec"]["minAvailable"] == 3, "every serving pod, so a whole cache allows no disruption"
    assert "maxUnavailable" not in budget["spec"], "the disruption controller would need a scale subresource"
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "an active that is not Ready serves nothing"
    owner = budget["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "WeightCache" and owner["controller"], "garbage-collected with the cache"
    assert engine_budget(cache)["spec"]["selector"]["matchLabels"]["weightcache.io/daemon-spec-hash"] == (
        daemon_spec_hash(cache)
    )


def test_the_budget_of_engine_groups_covers_every_pod_of_the_active_groups_not_only_their_leaders() -> None:
    cache = make(**TWO, **{"engine.replicas": 2})
    budget = engine_budget(cache)
    assert "weightcache.io/node-rank" not in budget["spec"]["selector"]["matchLabels"]
    assert engine_service(cache)["spec"]["selector"]["weightcache.io/node-rank"] == "0"
    assert budget["spec"]["minAvailable"] == 4, "two replicas of two pods each"


# --- what a cordon means for one pod -------------------------------------------------------------


def test_a_ready_active_on_a_cordoned_node_has_failed_by_the_cordon_which_demotes_and_is_not_final() -> None:
    failure = failure_of(running_engine("a", role="active"), {}, None, DRAINED)
    assert failure is not None and failure.signal == "NodeCordoned"
    assert not failure.final and not failure.retire and failure.since is None
    assert "node-1" in failure.detail and "cordoned" in failure.detail
    assert failure_of(running_engine("a", role="active", node="node-2"), {}, None, DRAINED) is None


def test_a_pod_failed_in_another_way_on_a_cordoned_node_is_named_by_that_failure() -> None:
    broken = running_engine("a", role="active", ready=False, started=1, ready_since=80)
    failure = failure_of(broken, {}, None, DRAINED)
    assert failure is not None and failure.signal == "ReadinessFailed" and failure.retire
    failure = failure_of(running_engine("a", role="active"), {"node-1": None}, None, DRAINED)
    assert failure is not None and failure.signal == "NodeNotReady"


def test_a_pod_the_api_marked_for_disruption_fails_at_once_and_is_demoted_rather_than_deleted() -> None:
    marked = running_engine("a", role="active")
    marked["status"]["conditions"].append(
        {
            "type": "DisruptionTarget",
            "status": "True",
            "reason": "EvictionByEvictionAPI",
            "message": "Eviction API: evicting",
            "lastTransitionTime": at(30),
        }
    )
    failure = failure_of(marked, {})
    assert failure is not None and failure.signal == "DisruptionTarget"
    assert failure.final and not failure.retire and failure.since is not None
    assert "EvictionByEvictionAPI" in failure.detail


def test_cordoned_nodes_are_those_marked_unschedulable() -> None:
    nodes = [node("node-1", unschedulable=True), node("node-2"), node("node-3")]
    assert cordoned_nodes(nodes) == {"node-1"}


# --- the plan of a replica -----------------------------------------------------------------------


def test_an_active_on_a_cordoned_node_hands_over_to_a_ready_standby_elsewhere_and_is_demoted_not_deleted() -> None:
    plan = plan_replica(
        [running_engine("a", role="active"), running_engine("s", role="standby", node="node-2", created=1)]
    )
    assert plan.promotion is not None and plan.promotion.promoted["metadata"]["name"] == "s"
    assert plan.promotion.failure is not None and plan.promotion.failure.signal == "NodeCordoned"
    assert plan.demote == ["a"] and plan.delete == []
    assert plan.create_standbys == 0, "the demoted active is the standby until the drain evicts it"
    assert plan.stranded is None


def test_a_standby_elsewhere_wins_over_one_on_the_failed_actives_own_cordoned_node() -> None:
    plan = plan_replica(
        [
            running_engine("a", role="active"),
            running_engine("s1", role="standby", created=1),
            running_engine("s2", role="standby", node="node-2", created=2),
        ]
    )
    assert plan.promotion is not None and plan.promotion.promoted["metadata"]["name"] == "s2"


def test_an_active_on_a_cordoned_node_keeps_serving_while_its_only_standby_is_there_too_and_says_why() -> None:
    plan = plan_replica([running_engine("a", role="active"), running_engine("s", role="standby", created=1)])
    assert plan.promotion is None and plan.demote == [] and plan.delete == []
    assert plan.stranded is not None
    for words in ("replica 0", "node-1", "a keeps serving", "kubectl drain", "PodDisruptionBudget", "uncordon"):
        assert words in plan.stranded, plan.stranded


def test_an_active_on_a_cordoned_node_waits_for_a_starting_standby_elsewhere_rather_than_handing_over() -> None:
    starting = running_engine("s", role="standby", ready=False, node="node-2", created=1, started=2, ready_since=0)
    plan = plan_replica([running_engine("a", role="active"), starting])
    assert plan.promotion is None and plan.stranded is not None and "kubectl drain" in plan.stranded


def test_a_standby_on_a_cordoned_node_still_takes_over_from_an_active_gone_for_good() -> None:
    active = running_engine("a", role="active", node="node-2")
    plan = plan_replica([active, running_engine("s", role="standby", created=1)], unready={"node-2": None})
    assert plan.promotion is not None and plan.promotion.promoted["metadata"]["name"] == "s"
    assert plan.promotion.failure is not None and plan.promotion.failure.signal == "NodeNotReady"


def test_of_two_actives_the_one_off_the_cordoned_node_stays() -> None:
    plan = plan_replica(
        [running_engine("a", role="active"), running_engine("b", role="active", node="node-2", created=1)]
    )
    assert plan.demote == ["a"] and plan.promotion is None and plan.delete == []


def test_without_a_cordon_nothing_changes() -> None:
    plan = plan_pods(
        0, [running_engine("a", role="active"), running_engine("s", role="standby", created=1)], 1, HASH, {}
    )
    assert plan.promotion is None and plan.demote == [] and plan.stranded is None


# --- placement and engine groups -----------------------------------------------------------------


def test_no_new_engine_is_placed_on_a_cordoned_node() -> None:
    cache = make(**{"engine.replicas": 1, "engine.standbysPerReplica": 1})
    daemons = {0: {"node-1": daemon("d1", node="node-1"), "node-2": daemon("d2", node="node-2")}}
    plan = engine_plan(cache, [], daemons, ids(), cordoned=["node-1"])
    created = [a.pod for a in plan.actions if isinstance(a, Create)]
    assert len(created) == 2
    for new in created:
        terms = new["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["node-2"]
    only_cordoned = {0: {"node-1": daemons[0]["node-1"]}}
    assert not any(
        isinstance(a, Create) for a in engine_plan(cache, [], only_cordoned, ids(), cordoned=["node-1"]).actions
    )


def test_a_cordon_under_a_follower_hands_the_active_group_over_whole_to_a_group_on_other_nodes() -> None:
    cache = make(**TWO)
    pods = group(cache, "ga", "active") + group(cache, "gb", "standby", nodes=("node-3", "node-4"), created=1)
    plan = engine_plan(cache, pods, FOUR_NODES, ids(), cordoned=["node-2"])
    actions = plan.actions
    assert failovers(actions) == [("tiny-0-gb-0", "tiny-0-ga-0", "NodeCordoned")]
    assert names(actions, SetRole, "active") == ["tiny-0-gb-0", "tiny-0-gb-1"]
    assert names(actions, SetRole, "standby") == ["tiny-0-ga-0", "tiny-0-ga-1"], "demoted whole"
    assert names(actions, Delete) == [] and not any(isinstance(a, Create) for a in actions)


def test_an_active_group_spanning_every_node_cannot_hand_over_and_the_status_says_the_drain_waits() -> None:
    cache = make(**TWO)
    pods = group(cache, "ga", "active") + group(cache, "gb", "standby", created=1)
    plan = engine_plan(cache, pods, FOUR_NODES, ids(), cordoned=["node-2"])
    assert failovers(plan.actions) == [] and plan.stranded and "kubectl drain" in plan.stranded[0]


def test_a_cordoned_node_keeps_its_daemon_slot() -> None:
    cordoned = copy.deepcopy(node("n-a", taints=[{"key": CORDON_TAINT, "effect": "NoSchedule"}]))
    assert selected(Placement(), cordoned), "DaemonSet pods tolerate the cordon: the slots stay put"
    assert not selected(Placement(), node("n-b", taints=[{"key": "other", "effect": "NoSchedule"}]))
