"""The writes of the passes of an engine rollout (a new engine template, the same daemons),
recording_kube.py: a surge standby first; once it is Ready it is promoted before the old engines
are deleted, and their replacement comes last."""

from __future__ import annotations

from pass_world import World, serving

NEW_TEMPLATE = [{"name": "engine", "image": "e:2", "command": ["weightcache", "engine"]}]


def test_the_spec_change_creates_a_surge_standby_and_touches_nothing_else() -> None:
    world = serving(World())
    world.change_spec(**{"engine.template.spec.containers": NEW_TEMPLATE})

    world.run(apply=True)

    assert world.api.steps() == [("create", "Pod", "tiny-0-00003"), ("patch", "WeightCache", "tiny/status")]
    assert world.role("tiny-0-00003") == "standby"


def test_a_ready_surge_is_gated_then_promoted_before_the_old_engines_go_and_a_new_standby_comes() -> None:
    world = serving(World())
    world.change_spec(**{"engine.template.spec.containers": NEW_TEMPLATE})
    world.run(apply=True)
    world.api.forget_writes()
    world.placed()

    world.run()

    writes = [w for w in world.api.writes if w.kind != "Event"]
    assert [(w.verb, w.kind, w.name) for w in writes] == [
        ("patch", "Pod", "tiny-0-00003"),
        ("patch", "Pod", "tiny-0-00003/status"),
        ("patch", "Pod", "tiny-0-00003"),
        ("delete", "Pod", "tiny-0-00001"),
        ("delete", "Pod", "tiny-0-00002"),
        ("create", "Pod", "tiny-0-00004"),
        ("patch", "WeightCache", "tiny/status"),
    ]
    assert writes[2].fields == ("metadata.labels.weightcache.io/role=active",)
    assert (world.role("tiny-0-00003"), world.role("tiny-0-00004")) == ("active", "standby")
