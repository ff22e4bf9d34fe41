"""A single-pod engine is a group of one: engine groups (``parallelism.nodes > 1``) are scaled,
failed over and rolled by the same planner as single pods, with the same rules. One scenario per
test, each through ``engine_plan.plan_engines``."""

from __future__ import annotations

from builders import after, make
from group_builders import (
    FOUR_NODES,
    READY,
    TWO,
    complete_groups,
    daemon,
    engine_plan,
    failovers,
    group,
    ids,
    names,
    plan_groups,
    readiness_failed,
)
from rollout_pods import daemon_replaced
from weightcache_operator.observe.responsiveness import probe_url
from weightcache_operator.plan.actions import Create, Delete, SetRole
from weightcache_operator.plan.rollout import planner
from weightcache_operator.plan.rollout.decisions import retired
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.render import SPEC_HASH_ANNOTATION, daemon_spec_hash, engine_template_hash


def test_a_failed_active_group_hands_over_to_the_ready_standby_group_on_its_leaders_node() -> None:
    cache = make(**TWO, **{"engine.standbysPerReplica": 2})
    active = readiness_failed(group(cache, "ga", "active"))
    older_elsewhere = group(cache, "gb", "standby", nodes=("node-3", "node-4"), created=-3600)
    same_node = group(cache, "gc", "standby")
    plan = plan_groups(cache, [*active, *older_elsewhere, *same_node], FOUR_NODES, ids())
    assert failovers(plan) == [("tiny-0-gc-0", "tiny-0-ga-0", "ReadinessFailed")]


def test_a_standby_group_on_other_weights_never_takes_over_a_failed_active_group() -> None:
    cache = make(**TWO)
    active = readiness_failed(group(cache, "ga", "active"))
    other_weights = group(cache, "gb", "standby", nodes=("node-3", "node-4"))
    for pod in other_weights:
        pod["metadata"]["annotations"][SPEC_HASH_ANNOTATION] = "another-generation"
    plan = engine_plan(cache, [*active, *other_weights], FOUR_NODES, ids())
    assert failovers(plan.actions) == [] and "tiny-0-ga-0" not in names(plan.actions, Delete)
    assert plan.stranded and "no Ready standby can take over" in plan.stranded[0]


def test_a_group_on_a_dead_node_hands_over_even_to_a_starting_standby_group() -> None:
    """A NotReady node will not serve again soon: a standby group still starting serves sooner
    than one created now. The cache says Degraded until it is Ready."""
    cache = make(**TWO)
    active = group(cache, "ga", "active")
    starting = group(cache, "gb", "standby", nodes=("node-3", "node-4"), ready=False)
    plan = engine_plan(cache, [*active, *starting], FOUR_NODES, ids(), {"node-1": None})
    assert failovers(plan.actions) == [("tiny-0-gb-0", "tiny-0-ga-0", "NodeNotReady")]
    assert names(plan.actions, Delete) == ["tiny-0-ga-0", "tiny-0-ga-1"]
    assert plan.stranded == ["replica 0: promoted tiny-0-gb-0, which is not Ready yet"]


def test_a_failed_active_group_keeps_serving_while_its_only_standby_group_is_starting() -> None:
    """Not gone for good (its pods may recover): the failed group is the best there is; the cache
    says Degraded (NoReadyStandby)."""
    cache = make(**TWO)
    active = readiness_failed(group(cache, "ga", "active"))
    starting = group(cache, "gb", "standby", nodes=("node-3", "node-4"), ready=False)
    plan = engine_plan(cache, [*active, *starting], FOUR_NODES, ids())
    assert [a for a in plan.actions if not isinstance(a, Create)] == []
    assert len(plan.stranded) == 1 and "fails its readiness probe" in plan.stranded[0]
    assert plan.stranded[0].endswith("no Ready standby can take over; keeping it")


def test_a_failed_active_group_is_deleted_whole_once_a_standby_group_took_over() -> None:
    cache = make(**TWO)
    active = readiness_failed(group(cache, "ga", "active"))
    standby = group(cache, "gb", "standby", nodes=("node-3", "node-4"))
    plan = plan_groups(cache, [*active, *standby], FOUR_NODES, ids())
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-0", "ReadinessFailed")]
    assert names(plan, SetRole, "active") == ["tiny-0-gb-0", "tiny-0-gb-1"]
    assert names(plan, Delete) == ["tiny-0-ga-0", "tiny-0-ga-1"] and names(plan, SetRole, "standby") == []
    created = [a.pod["metadata"]["labels"] for a in plan if isinstance(a, Create)]
    assert [(c["weightcache.io/role"], c["weightcache.io/node-rank"]) for c in created] == [("standby", "0")]


def test_a_silent_group_leader_swaps_roles_with_an_answering_standby_group_and_is_kept() -> None:
    """The operator's probes reach a group through its leader; slow looks like hung from
    outside, so the silent group is demoted whole, not deleted."""
    cache = make(**TWO)
    pods = complete_groups(cache)
    silent = {"tiny-0-ga-0": after(300)}
    plan = engine_plan(cache, pods, READY, ids(), unresponsive=silent)
    assert failovers(plan.actions) == [("tiny-0-gb-0", "tiny-0-ga-0", "Unresponsive")]
    assert names(plan.actions, SetRole, "standby") == ["tiny-0-ga-0", "tiny-0-ga-1"]
    assert names(plan.actions, Delete) == [] and names(plan.actions, Create) == []


def test_only_a_groups_leader_has_a_readiness_endpoint_for_the_operator_to_probe() -> None:
    cache = make(**TWO)
    leader, follower = group(cache, "ga", "active")
    assert probe_url(leader) is not None and probe_url(follower) is None


def test_a_group_whose_follower_is_being_deleted_goes_whole_and_a_standby_group_takes_over() -> None:
    """Its leader cannot serve without the follower's ranks."""
    cache = make(**TWO)
    pods = complete_groups(cache)
    pods[1]["metadata"]["deletionTimestamp"] = "2026-11-29T10:01:00Z"
    plan = plan_groups(cache, pods, READY, ids())
    assert failovers(plan) == [("tiny-0-gb-0", "tiny-0-ga-0", "PodDeleted")]
    assert [(a.name, a.why) for a in plan if isinstance(a, Delete)] == [
        ("tiny-0-ga-0", "another pod of its engine group is being deleted")
    ]


def test_an_operator_restarted_mid_failover_of_groups_keeps_the_ready_active_and_promotes_nobody() -> None:
    """Two active groups (promoted, failed one not yet retired): the failed one goes whole, as
    the interrupted failover would have done, and a replacement standby group starts."""
    cache = make(**TWO)
    failed = readiness_failed(group(cache, "ga", "active"))
    promoted = group(cache, "gb", "active", nodes=("node-3", "node-4"))
    plan = plan_groups(cache, [*failed, *promoted], FOUR_NODES, ids())
    assert failovers(plan) == [] and names(plan, SetRole) == []
    assert names(plan, Delete) == ["tiny-0-ga-0", "tiny-0-ga-1"]
    assert len([a for a in plan if isinstance(a, Create)]) == 1


def test_a_replacement_standby_group_waits_until_every_slot_has_a_ready_daemon() -> None:
    cache = make(**TWO)
    active = group(cache, "ga", "active")
    assert plan_groups(cache, active, {0: READY[0]}, ids()) == []
    assert [type(a) for a in plan_groups(cache, active, READY, ids())] == [Create]


def test_engine_groups_roll_one_replica_at_a_time() -> None:
    """As single pods: the next replica's surge group starts once the previous replica is whole
    on the new version, so a rollout never holds more than one extra group."""
    old_cache = make(**TWO, **{"engine.replicas": 2, "engine.standbysPerReplica": 0})
    new_cache = make(
        **TWO,
        **{
            "engine.replicas": 2,
            "engine.standbysPerReplica": 0,
            "engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}],
        },
    )
    old = [*group(old_cache, "ga", "active"), *group(old_cache, "gb", "active", replica=1)]
    plan = plan_groups(new_cache, old, READY, ids())
    surges = [a.pod["metadata"]["labels"] for a in plan if isinstance(a, Create)]
    assert [(s["weightcache.io/replica"], s["weightcache.io/role"]) for s in surges] == [("0", "standby")]


def test_a_stalled_group_rollout_promotes_and_retires_nothing_and_says_why() -> None:
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]})
    old = complete_groups(old_cache)
    stuck = group(new_cache, "gn", "standby", ready=False, created=-3600)
    plan = engine_plan(new_cache, [*old, *stuck], READY, ids())
    assert plan.actions == [] and plan.rollout.phase == "Stalled"
    assert plan.rollout.stalled is not None and "engine group tiny-0-gn-0" in plan.rollout.stalled


def test_a_node_by_node_generation_change_of_groups_leaves_their_daemons_to_the_slot_daemonsets() -> None:
    """Slot DaemonSets roll their own daemon pods; no node is drained for them, and the change is
    reported as a generation change as soon as a daemon holds another generation."""
    old_cache = make(**TWO)
    new_cache = make(**TWO, **{"model.revision": "r2"})
    old_gen = daemon_spec_hash(old_cache)
    want = Desired(engine_template_hash(new_cache), daemon_spec_hash(new_cache), 1, 1, 600)
    daemons = [daemon(node, slot, spec_hash=old_gen, ready=True) for node, slot in (("node-1", 0), ("node-2", 1))]
    at = after(300)
    result = planner.plan(want, complete_groups(old_cache), daemons, old_gen, at, size=2)
    assert result.mode == "Generation" and daemon_replaced(result) is None and retired(result) == []
