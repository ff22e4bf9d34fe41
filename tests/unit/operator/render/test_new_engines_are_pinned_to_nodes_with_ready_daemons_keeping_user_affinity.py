"""A new engine pod is pinned to the nodes whose daemons are ready, within the placement's own affinity."""

from __future__ import annotations

from builders import make
from weightcache_operator.render import (
    engine_pod,
)


def test_new_engines_are_pinned_to_nodes_with_ready_daemons_keeping_user_affinity() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    pod = engine_pod(make(**{"placement.affinity": affinity}), 0, "active", nodes=["node-2", "node-1"])
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-2"]},
            ]
        }
    ]
    assert "nodeAffinity" not in (engine_pod(make(), 0, "active").get("spec", {}).get("affinity") or {})
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [term], (
        "the spec's affinity object must not be mutated"
    )
