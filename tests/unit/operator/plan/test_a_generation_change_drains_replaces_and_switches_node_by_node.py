"""A daemon generation change node by node: a node is drained of engines not serving, its daemon replaced
once they are gone, new engines surge on the loaded daemon, and the Service keeps the old generation until
every replica has a Ready new one; status lists a node once meanwhile."""

from __future__ import annotations

from builders import NOW
from rollout_pods import GEN, daemon, daemon_replaced, engine, held
from weightcache_operator.plan.rollout.decisions import promoted, retired
from weightcache_operator.plan.rollout.generation import serve_hash
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.views import Desired, EngineView
from weightcache_operator.spec import RolloutStatus


def test_the_service_keeps_the_old_generation_until_every_replica_has_a_ready_new_one() -> None:
    one = Desired(engine_hash="new", daemon_hash="g2", replicas=2, standbys=0, ready_deadline_s=60)
    views = [
        EngineView.of(p)
        for p in (
            engine("a0", 0, "active", "old", "g1"),
            engine("a1", 1, "active", "old", "g1"),
            engine("n0", 0, "standby", generation="g2"),
        )
    ]
    assert serve_hash(one, views, "g1") == "g1"
    views.append(EngineView.of(engine("n1", 1, "standby", generation="g2")))
    assert serve_hash(one, views, "g1") == "g1", "Ready, but not labelled active yet"
    labelled = [
        *views[:2],
        *(EngineView.of(engine(n, r, "active", generation="g2")) for n, r in (("n0", 0), ("n1", 1))),
    ]
    assert serve_hash(one, labelled, "g1") == "g2"
    # Nothing of the old generation serves any more and the new one serves something: switch.
    dead = [EngineView.of(engine("a0", 0, "active", "old", "g1", ready=False)), views[2]]
    assert serve_hash(one, dead, "g1") == "g2"
    # Neither serves (the old one may recover): stay, rather than select nothing Ready for good.
    neither = [dead[0], EngineView.of(engine("n0", 0, "standby", generation="g2", ready=False))]
    assert serve_hash(one, neither, "g1") == "g1"
    assert serve_hash(one, neither, "g2") == "g2", "a switch is never taken back"
    assert serve_hash(one, [], None) == "g2", "a new Service selects the current generation"


def test_generation_change_drains_the_node_without_serving_engines_first() -> None:
    pods = [
        engine("a0", 0, "active", "old", "g1", node="node-1"),
        engine("s0", 0, "standby", "old", "g1", node="node-2"),
    ]
    daemons = [daemon("d1", "node-1", "g1"), daemon("d2", "node-2", "g1")]
    result = plan(GEN, pods, daemons, "g1", NOW, None, 2)
    assert (result.mode, result.serve_hash, retired(result)) == ("Generation", "g1", ["s0"])
    assert daemon_replaced(result) is None, "the daemon goes only once its engines are gone"
    drained = plan(
        GEN,
        [pods[0], {**pods[1], "metadata": {**pods[1]["metadata"], "deletionTimestamp": "x"}}],
        daemons,
        "g1",
        NOW,
        None,
        2,
    )
    assert daemon_replaced(drained) is None and "draining" in drained.step
    result = plan(GEN, [pods[0]], daemons, "g1", NOW, None, 2)
    assert daemon_replaced(result) == "d2" and retired(result) == []


def test_generation_change_waits_for_the_replaced_daemon_then_surges_and_switches() -> None:
    active = engine("a0", 0, "active", "old", "g1", node="node-1")
    loading = [daemon("d1", "node-1", "g1"), daemon("d2b", "node-2", "g2", ready=False)]
    result = plan(GEN, [active], loading, "g1", NOW, None, 2)
    assert (result.create, daemon_replaced(result)) == ([], None) and "load" in result.step
    loaded = [daemon("d1", "node-1", "g1"), daemon("d2b", "node-2", "g2")]
    result = plan(GEN, [active], loaded, "g1", NOW, None, 2)
    assert result.create == [0] and daemon_replaced(result) is None and retired(result) == []
    assert "before draining node-1" in result.step, "node-1 still serves; it waits for the switch"
    surge = engine("n0", 0, "standby", generation="g2", node="node-2")
    result = plan(GEN, [active, surge], loaded, "g1", NOW, None, 2)
    # Promoted first, while the Service still selects g1; the switch comes in the next pass.
    assert result.serve_hash == "g1" and promoted(result) == ["n0"] and retired(result) == []
    assert held(result) == {"n0"}, "two actives for a moment: the scaler must not demote the new one"
    new_active = engine("n0", 0, "active", generation="g2", node="node-2")
    result = plan(GEN, [active, new_active], loaded, "g1", NOW, None, 2)
    # The switch: a0 keeps serving what still reaches it until the next pass.
    assert result.serve_hash == "g2" and result.switching and promoted(result) == [] and retired(result) == []
    assert held(result) == {"n0"}
    result = plan(GEN, [active, new_active], loaded, "g2", NOW, None, 2)
    assert not result.switching and retired(result) == ["a0"] and held(result) == set()
    # After the switch node-1 serves nothing: its old daemon is next, once a0 has drained.
    after = [engine("n0", 0, "active", generation="g2", node="node-2")]
    result = plan(GEN, after, loaded, "g2", NOW, None, 2)
    assert daemon_replaced(result) == "d1"
    done = plan(
        GEN,
        [*after, engine("m0", 0, "standby", generation="g2", node="node-2")],
        [daemon("d1b", "node-1", "g2"), loaded[1]],
        "g2",
        NOW,
        RolloutStatus(phase="Progressing", mode="Generation"),
        2,
    )
    assert (done.mode, done.phase) == ("Generation", "Complete")


def test_status_lists_a_node_once_while_its_daemon_is_replaced() -> None:
    """status.nodes is a map keyed by node: two entries for one node are refused by the API server."""
    from weightcache_operator.observe.validation import parse
    from weightcache_operator.plan.status import Observed, aggregate

    body = {
        "apiVersion": "weightcache.io/v1alpha1",
        "kind": "WeightCache",
        "metadata": {"name": "tiny", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": {
            "model": {"source": {"hostPath": {"path": "/m"}}},
            "parallelism": {"tensor": 1},
            "daemon": {"image": "i", "backend": "cpu-shm"},
            "engine": {"template": {"spec": {"containers": [{"name": "e", "image": "i"}]}}},
        },
    }
    cache, problems = parse(body)
    assert cache is not None and not problems
    old = daemon("d-old", "node-1", "g0", deleted=0)
    new = daemon("d-new", "node-1", "g1", ready=False)
    status = aggregate(cache, Observed([old, new], [], 1), NOW).wire()
    assert [(n["node"], n["daemonPod"]) for n in status["nodes"]] == [("node-1", "d-new")]
