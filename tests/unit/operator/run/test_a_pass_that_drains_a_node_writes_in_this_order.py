"""The writes of passes over a cordoned node's active engine (``kubectl drain``'s first step),
recording_kube.py: it hands over to its standby, the Service never without an active behind it,
and the disruption budget is made to count again once the old active left it."""

from __future__ import annotations

from builders import node
from pass_world import World, serving


def cordon(world: World, name: str) -> None:
    world.reconciler.nodes.put(node(name, labels={"pool": "gpu"}, ready=True, unschedulable=True))


def test_the_standby_is_promoted_then_the_active_demoted_then_the_budget_recounted() -> None:
    world = serving(World())
    cordon(world, "node-1")

    world.run()

    writes = [w for w in world.api.writes if w.kind != "Event"]
    assert [(w.verb, w.kind, w.name) for w in writes] == [
        ("patch", "Pod", "tiny-0-00002"),
        ("patch", "Pod", "tiny-0-00001"),
        ("patch", "PodDisruptionBudget", "tiny-active"),
        ("patch", "WeightCache", "tiny/status"),
    ]
    assert writes[0].fields == ("metadata.labels.weightcache.io/role=active",)
    assert writes[1].fields == ("metadata.labels.weightcache.io/role=standby",)
    assert writes[2].fields == (
        "metadata.annotations.weightcache.io/serving-engines=tiny-0-00002 (2026-11-29T10:10:00.000+00:00)",
    )


def test_a_resync_during_a_drain_applies_the_service_between_the_promotion_and_the_demotion() -> None:
    world = serving(World())
    edited = world.api.stored("Service", "tiny")
    edited["spec"]["selector"] = {"app": "hand-edited"}
    world.api.put("Service", edited)
    cordon(world, "node-1")

    world.run(apply=True)

    assert world.api.steps() == [
        ("patch", "Pod", "tiny-0-00002"),
        ("apply", "Service", "tiny"),
        ("patch", "Pod", "tiny-0-00001"),
        ("patch", "PodDisruptionBudget", "tiny-active"),
        ("patch", "WeightCache", "tiny/status"),
    ]
