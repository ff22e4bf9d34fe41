"""parallelism.nodes > 1: which nodes a cache may use (its placement) and the rank slot each one
holds (sorted by name, in groups of ``parallelism.nodes``)."""

from __future__ import annotations

from builders import node
from weightcache_operator.render.topology import assign_slots, selected
from weightcache_operator.spec import Placement


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
