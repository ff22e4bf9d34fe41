"""Engine rollouts over several replicas at once (``spec.engine.rollout.maxSurge``): the planner
(rollout.planner.plan) and what the one engine planner (engine_plan.plan_engines) creates from it. The
e2e test test_rollout_surge_e2e.py runs the same decisions on a real control plane."""

from __future__ import annotations

from typing import Any

from builders import NOW, make
from group_builders import READY, TWO, daemon, engine_plan, ids, run
from rollout_pods import DAEMONS, engine, held, old_pair
from rollout_pods import daemon as rollout_daemon
from weightcache_operator.plan.actions import ApplyService, Create, Delete, SetRole
from weightcache_operator.plan.engine_plan import desired
from weightcache_operator.plan.rollout.decisions import promoted, retired
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.render import engine_pod
from weightcache_operator.render.engine import Member
from weightcache_operator.spec import EngineRollout


def want(max_surge: int, replicas: int = 4) -> Desired:
    return Desired(
        engine_hash="new", daemon_hash="g1", replicas=replicas, standbys=1, ready_deadline_s=60, max_surge=max_surge
    )


def old_replicas(*replicas: int) -> list[dict[str, Any]]:
    return [pod for r in replicas for pod in old_pair(r)]


def whole(replica: int) -> list[dict[str, Any]]:
    """A replica already on the new version: a Ready active and a Ready standby."""
    return [engine(f"n{replica}", replica, "active"), engine(f"m{replica}", replica, "standby")]


def surge(replica: int, *, ready: bool = False, age_s: float = 10) -> dict[str, Any]:
    return engine(f"n{replica}", replica, "standby", ready=ready, age_s=age_s)


# --- the planner --------------------------------------------------------------------------------


def test_max_surge_defaults_to_one_and_then_one_replica_rolls_at_a_time_as_before() -> None:
    assert EngineRollout().max_surge == 1 and desired(make()).max_surge == 1
    default = Desired(engine_hash="new", daemon_hash="g1", replicas=4, standbys=1, ready_deadline_s=60)
    result = plan(default, old_replicas(0, 1, 2, 3), DAEMONS, "g1", NOW, None, 2)
    assert result.create == [0] and result.step == "replica 0: starting a new-version standby"
    waiting = plan(default, [*old_replicas(0, 1, 2, 3), surge(0)], DAEMONS, "g1", NOW, None, 2)
    assert waiting.create == [] and held(waiting) == {"n0"}


def test_max_surge_two_starts_surges_for_the_first_two_replicas_at_once_and_the_others_wait() -> None:
    result = plan(want(2), old_replicas(0, 1, 2, 3), DAEMONS, "g1", NOW, None, 2)
    assert (result.mode, result.phase, result.create) == ("Engine", "Progressing", [0, 1])
    assert result.step == "replica 0: starting a new-version standby; replica 1: starting a new-version standby"
    both = plan(want(2), [*old_replicas(0, 1, 2, 3), surge(0), surge(1)], DAEMONS, "g1", NOW, None, 2)
    assert both.create == [] and held(both) == {"n0", "n1"}, "neither surge is counted or trimmed as a standby"


def test_max_surge_three_starts_three_surges_at_once() -> None:
    result = plan(want(3), old_replicas(0, 1, 2, 3), DAEMONS, "g1", NOW, None, 2)
    assert result.create == [0, 1, 2]


def test_a_max_surge_above_the_replicas_starts_every_replica_at_once() -> None:
    result = plan(want(5, replicas=2), old_replicas(0, 1), DAEMONS, "g1", NOW, None, 2)
    assert result.create == [0, 1]


def test_each_replica_in_flight_is_promoted_and_drained_on_its_own() -> None:
    pods = [*old_replicas(0, 1, 2, 3), surge(0, ready=True), surge(1)]
    result = plan(want(2), pods, DAEMONS, "g1", NOW, None, 2)
    assert promoted(result) == ["n0"] and sorted(retired(result)) == ["a0", "s0"]
    assert held(result) == {"n1"} and result.create == [], "replica 1 waits for its own surge; no third starts"
    assert result.step == "replica 0: promoted n0, draining a0; replica 1: waiting for n1 to turn Ready"


def test_the_third_replica_starts_as_soon_as_either_of_the_first_two_is_whole() -> None:
    # Replica 1 finished first: replica 2 takes its slot while replica 0 still waits.
    pods = [*old_pair(0), surge(0), *whole(1), *old_replicas(2, 3)]
    result = plan(want(2), pods, DAEMONS, "g1", NOW, None, 2)
    assert (result.create, held(result), result.updated) == ([2], {"n0"}, 1)
    # Not before it is whole: a replica whose old active still drains holds its slot.
    draining = [engine("n1", 1, "active"), engine("a1", 1, "active", "old", deleting=True)]
    result = plan(want(2), [*old_pair(0), surge(0), *draining, *old_replicas(2, 3)], DAEMONS, "g1", NOW, None, 2)
    assert result.create == [] and "replica 1: waiting for old engines to finish draining" in result.step


def test_max_surge_three_fills_every_slot_that_frees() -> None:
    pods = [*whole(0), *old_pair(1), surge(1), *whole(2), *old_pair(3)]
    result = plan(want(3), pods, DAEMONS, "g1", NOW, None, 2)
    assert result.create == [3] and held(result) == {"n1"} and result.updated == 2


def test_a_stall_starts_no_further_replica_while_the_replicas_under_way_finish() -> None:
    stuck = surge(0, age_s=61)
    pods = [*old_pair(0), stuck, *old_pair(1), surge(1, ready=True), *old_replicas(2, 3)]
    result = plan(want(2), pods, DAEMONS, "g1", NOW, None, 2)
    assert result.phase == "Stalled" and result.stalled and "n0" in result.stalled
    assert promoted(result) == ["n1"] and sorted(retired(result)) == ["a1", "s1"], "a Ready surge still takes over"
    assert held(result) == {"n0"} and result.create == []
    # Replica 1 is whole: its slot stays empty while replica 0 is stuck.
    later = plan(want(2), [*old_pair(0), stuck, *whole(1), *old_replicas(2, 3)], DAEMONS, "g1", NOW, None, 2)
    assert later.phase == "Stalled" and later.create == [] and retired(later) == [] and promoted(later) == []
    assert later.step.endswith("replica 2: not started while the rollout is stalled"), later.step
    # The stuck engine turns Ready after all: the rollout goes on where it was.
    recovered = plan(
        want(2), [*old_pair(0), surge(0, ready=True), *whole(1), *old_replicas(2, 3)], DAEMONS, "g1", NOW, None, 2
    )
    assert recovered.phase == "Progressing" and promoted(recovered) == ["n0"] and recovered.create == [2]


def test_a_generation_change_starts_every_replica_s_new_engine_whatever_max_surge_says() -> None:
    change = Desired(engine_hash="new", daemon_hash="g2", replicas=4, standbys=1, ready_deadline_s=60, max_surge=1)
    daemons = [*DAEMONS, rollout_daemon("d3", "node-1", "g2")]
    result = plan(change, old_replicas(0, 1, 2, 3), daemons, "g1", NOW, None, 2)
    assert result.mode == "Generation" and result.create == [0, 1, 2, 3]


# --- through the engine planner -----------------------------------------------------------------

NEW_IMAGE = {"engine.template.spec.containers": [{"name": "engine", "image": "engine:2"}]}


def test_the_engine_planner_creates_one_new_version_standby_for_each_replica_in_flight() -> None:
    shape = {"engine.replicas": 4, "engine.standbysPerReplica": 1, "engine.rollout": {"maxSurge": 2}}
    old_cache, new_cache = make(**shape), make(**shape, **NEW_IMAGE)
    old = [
        run(engine_pod(old_cache, r, role, ["node-1"]), "node-1", f"198.18.1.{10 + i}", ready=True)
        for i, (r, role) in enumerate((r, role) for r in range(4) for role in ("active", "standby"))
    ]
    for i, pod in enumerate(old):
        pod["metadata"]["name"] = f"old-{i}"
    plan_ = engine_plan(new_cache, old, {0: {"node-1": daemon("node-1", 0)}}, ids())
    created = [a.pod for a in plan_.actions if isinstance(a, Create)]
    assert [
        (p["metadata"]["labels"]["weightcache.io/replica"], p["metadata"]["labels"]["weightcache.io/role"])
        for p in created
    ] == [
        ("0", "standby"),
        ("1", "standby"),
    ]
    hashes = {p["metadata"]["labels"]["weightcache.io/engine-hash"] for p in created}
    assert hashes == {desired(new_cache).engine_hash} != {old[0]["metadata"]["labels"]["weightcache.io/engine-hash"]}
    assert not [a for a in plan_.actions if not isinstance(a, (Create, ApplyService))], "nothing else moves yet"


def test_engine_groups_surge_as_whole_groups_max_surge_at_a_time() -> None:
    """parallelism.nodes 2: each surge is a new group (its leader first), one per replica in
    flight, each on its own rendezvous port."""
    shape = {**TWO, "engine.replicas": 3, "engine.rollout": {"maxSurge": 2}}
    old_cache, new_cache = make(**shape), make(**shape, **NEW_IMAGE)
    old = []
    for replica in range(3):
        for group, role in ((f"a{replica}", "active"), (f"b{replica}", "standby")):
            ip = f"198.18.1.{len(old) + 5}"
            port = 29500 + len(old) // 2
            leader = engine_pod(old_cache, replica, role, ["node-1"], member=Member(group, 0, port=port))
            old.append(run(leader, "node-1", ip, ready=True))
            follower = engine_pod(old_cache, replica, role, ["node-2"], member=Member(group, 1, ip, port))
            old.append(run(follower, "node-2", f"198.18.2.{len(old) + 5}", ready=True))
    plan_ = engine_plan(new_cache, old, READY, ids())
    leaders = [a.pod for a in plan_.actions if isinstance(a, Create)]
    labels = [p["metadata"]["labels"] for p in leaders]
    assert [(x["weightcache.io/replica"], x["weightcache.io/node-rank"], x["weightcache.io/role"]) for x in labels] == [
        ("0", "0", "standby"),
        ("1", "0", "standby"),
    ]
    ports = [p["metadata"]["annotations"]["weightcache.io/dist-port"] for p in leaders]
    assert len(set(ports)) == 2 and not set(ports) & {str(29500 + i) for i in range(6)}
    assert not [a for a in plan_.actions if isinstance(a, (Delete, SetRole))]
