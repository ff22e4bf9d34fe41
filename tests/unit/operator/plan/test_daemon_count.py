"""How many nodes a cache waits for daemons on (engine_plan.nodes_to_run): the DaemonSet's own
count, except for nodes that are down but still in it — a count the DaemonSet controller took
just before the node's unreachable taint, and kept."""

from __future__ import annotations

from builders import NOW, daemon, daemonset, node
from engine_snapshots import CACHE, WANT, snapshot
from weightcache_operator.plan.engine_plan import nodes_to_run, plan_engines

PODS = [daemon(node="node-1", owner="ds-1", ready=True), daemon(node="node-2", owner="ds-1", ready=False)]


def test_a_count_that_still_includes_a_down_node_leaves_it_out() -> None:
    assert nodes_to_run(daemonset(desired=2), PODS, {"node-2"}) == 1


def test_a_fresh_count_already_left_it_out_and_is_not_reduced_again() -> None:
    # The controller's own recount: node-2 no longer counted, its pod misscheduled.
    assert nodes_to_run(daemonset(desired=1, misscheduled=1), PODS, {"node-2"}) == 1


def test_with_every_node_up_the_count_is_the_daemonsets() -> None:
    assert nodes_to_run(daemonset(desired=2), PODS, set()) == 2
    assert nodes_to_run(daemonset(desired=3), PODS, set()) == 3, "a node whose daemon pod is not created yet counts"


def test_another_daemonsets_pod_on_a_down_node_changes_nothing() -> None:
    # The old generation of a blue/green change runs next to the new one on the same nodes.
    pods = [*PODS, daemon(node="node-3", owner="ds-old", ready=True)]
    assert nodes_to_run(daemonset(desired=3), pods, {"node-3"}) == 3


def test_the_pass_waits_for_no_daemon_on_a_dead_node_the_daemonset_still_counts() -> None:
    state = snapshot()
    state.daemonsets = [daemonset(desired=2)]
    state.daemonsets[0]["metadata"]["labels"] = {"weightcache.io/component": "daemon"}
    state.daemon_pods = [*state.daemon_pods, daemon(node="node-2", owner="ds-1", ready=False)]
    state.daemon_pods[0]["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "uid": "ds-1"}]
    state.nodes = [node("node-1", ready=True), node("node-2", ready=False)]
    assert plan_engines(CACHE, state, WANT, NOW, apply_service=False).desired_nodes == 1
    state.nodes = [node("node-1", ready=True), node("node-2", ready=True)]
    assert plan_engines(CACHE, state, WANT, NOW, apply_service=False).desired_nodes == 2
