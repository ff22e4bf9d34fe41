"""A blue/green generation change: the old generation's DaemonSet goes only after the Service has switched
and the old engines have drained."""

from __future__ import annotations

from builders import NOW
from rollout_pods import GEN, daemon, daemon_replaced, daemonsets_deleted, engine
from weightcache_operator.plan.rollout.decisions import promoted, retired
from weightcache_operator.plan.rollout.planner import plan


def test_blue_green_retires_the_old_daemonset_only_after_the_switch_and_the_drain() -> None:
    old_engines = [
        engine("a0", 0, "active", "old", "g1", node="node-1"),
        engine("s0", 0, "standby", "old", "g1", node="node-2"),
    ]
    both = [
        daemon("d1", "node-1", "g1"),
        daemon("d2", "node-2", "g1"),
        daemon("n1", "node-1", "g2", ready=False),
        daemon("n2", "node-2", "g2", ready=False),
    ]
    for pod in both[:2]:
        pod["metadata"]["ownerReferences"] = [{"name": "tiny-daemon", "controller": True}]
    old_sets = {"tiny-daemon": "g1"}
    loading = plan(GEN, old_engines, both, "g1", NOW, None, 2, old_sets)
    assert (loading.mode, loading.serve_hash) == ("Generation", "g1")
    assert retired(loading) == [] and daemon_replaced(loading) is None and daemonsets_deleted(loading) == []
    assert loading.create == [] and "old ones serve" in loading.step, "nothing moves before the new daemons load"
    loaded = [*both[:2], daemon("n1", "node-1", "g2"), daemon("n2", "node-2", "g2")]
    loaded[0]["metadata"]["ownerReferences"] = loaded[1]["metadata"]["ownerReferences"] = both[0]["metadata"][
        "ownerReferences"
    ]
    surge = plan(GEN, old_engines, loaded, "g1", NOW, None, 2, old_sets)
    assert surge.create == [0] and retired(surge) == [] and daemon_replaced(surge) is None
    new = engine("n0", 0, "standby", generation="g2", node="node-1")
    promote = plan(GEN, [*old_engines, new], loaded, "g1", NOW, None, 2, old_sets)
    assert promote.serve_hash == "g1" and promoted(promote) == ["n0"] and retired(promote) == []
    new_active = engine("n0", 0, "active", generation="g2", node="node-1")
    switch = plan(GEN, [*old_engines, new_active], loaded, "g1", NOW, None, 2, old_sets)
    assert switch.serve_hash == "g2" and switch.switching and promoted(switch) == [] and retired(switch) == []
    settling = plan(GEN, [*old_engines, new_active], loaded, "g2", NOW, None, 2, old_sets, settling=True)
    assert settling.switching and retired(settling) == [], "the switch has not reached every proxy yet"
    retire = plan(GEN, [*old_engines, new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert not retire.switching and sorted(retired(retire)) == ["a0", "s0"]
    assert daemonsets_deleted(retire) == [], "the old engines still map the old arenas"
    draining = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": "x"}} for p in old_engines]
    waiting = plan(GEN, [*draining, new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert daemonsets_deleted(waiting) == [] and "draining 2 engines" in waiting.step
    assert daemon_replaced(waiting) is None, "blue/green never deletes a serving generation's daemon pod by pod"
    gone = plan(GEN, [new_active], loaded, "g2", NOW, None, 2, old_sets)
    assert daemonsets_deleted(gone) == ["tiny-daemon"] and daemon_replaced(gone) is None
