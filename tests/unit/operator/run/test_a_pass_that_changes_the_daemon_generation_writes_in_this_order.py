"""The writes of every pass of a daemon generation change (recording_kube.py). Node by node: a
node is drained of its standby, its daemon replaced, new engines start there, the new active is
promoted next to the old one, the Service switches, and only a settled switch later the old
active goes — the Service never selects a generation without a Ready active. A managed
InferencePool follows the Service in the same pass."""

from __future__ import annotations

from builders import BASE, changed
from pass_world import World, serving
from weightcache_operator.plan.actions import SyncRouting
from weightcache_operator.vocabulary import SPEC_HASH_LABEL


def test_each_pass_of_a_node_by_node_change_writes_its_step_in_order() -> None:
    world = serving(World())
    world.change_spec(**{"daemon.image": "wc/daemon:2"})
    passes = []
    world.run(apply=True)
    for _ in range(8):
        passes.append(world.api.steps())
        world.api.forget_writes()
        world.terminated()
        world.daemons_run()
        world.placed()
        world.later(30)
        world.run()

    status = ("patch", "WeightCache", "tiny/status")
    assert passes == [
        [("apply", "DaemonSet", "tiny-daemon"), ("delete", "Pod", "tiny-0-00002"), status],
        [("delete", "Pod", "tiny-daemon-node-2"), status],
        [("create", "Pod", "tiny-0-00003"), ("create", "Pod", "tiny-0-00004"), status],
        [
            ("patch", "Pod", "tiny-0-00003"),
            ("patch", "Pod", "tiny-0-00003/status"),
            ("patch", "Pod", "tiny-0-00004"),
            ("patch", "Pod", "tiny-0-00004/status"),
            ("patch", "Pod", "tiny-0-00003"),
            status,
        ],
        [("apply", "Service", "tiny"), ("apply", "PodDisruptionBudget", "tiny-active"), status],
        [("delete", "Pod", "tiny-0-00001"), status],
        [("delete", "Pod", "tiny-daemon-node-1"), status],
        [status],
    ]
    assert world.body["status"]["rollout"]["phase"] == "Complete"


def test_each_pass_of_a_blue_green_change_writes_its_step_in_order() -> None:
    world = serving(World(changed(BASE, **{"daemon.generationChange": "Auto"}), roomy=True))
    world.change_spec(**{"daemon.image": "wc/daemon:2"})
    passes = []
    world.run(apply=True)
    for _ in range(7):
        passes.append(world.api.steps())
        world.api.forget_writes()
        world.terminated()
        world.daemons_run()
        world.placed()
        world.later(30)
        world.run()

    status = ("patch", "WeightCache", "tiny/status")
    new_set = "tiny-daemon-6d36df17d4"
    assert passes == [
        [("apply", "DaemonSet", new_set), status],
        [("create", "Pod", "tiny-0-00003"), status],
        [
            ("patch", "Pod", "tiny-0-00003"),
            ("patch", "Pod", "tiny-0-00003/status"),
            ("patch", "Pod", "tiny-0-00003"),
            status,
        ],
        [("apply", "Service", "tiny"), ("apply", "PodDisruptionBudget", "tiny-active"), status],
        [
            ("delete", "Pod", "tiny-0-00001"),
            ("delete", "Pod", "tiny-0-00002"),
            ("create", "Pod", "tiny-0-00004"),
            status,
        ],
        [
            ("patch", "Pod", "tiny-0-00004"),
            ("patch", "Pod", "tiny-0-00004/status"),
            ("delete", "DaemonSet", "tiny-daemon"),
            status,
        ],
        [status],
    ]
    assert world.api.names("DaemonSet") == [new_set]
    assert world.body["status"]["rollout"]["phase"] == "Complete"


def test_a_managed_inference_pool_switches_generation_in_the_pass_the_service_does_right_after_it() -> None:
    routing = {"inferencePool": {"mode": "Managed"}}
    world = serving(World(changed(BASE, **{"daemon.generationChange": "Auto", "routing": routing}), roomy=True))
    world.change_spec(**{"daemon.image": "wc/daemon:2"})
    world.run(apply=True)
    for _ in range(8):  # the switch is the fourth pass (above)
        if ("apply", "Service", "tiny") in world.api.steps():
            break
        world.api.forget_writes()
        world.terminated()
        world.daemons_run()
        world.placed()
        world.later(30)
        world.run()

    assert world.api.steps() == [
        ("apply", "Service", "tiny"),
        ("apply", "PodDisruptionBudget", "tiny-active"),
        ("apply", "InferencePool", "tiny"),
        ("patch", "WeightCache", "tiny/status"),
    ]
    selects = world.api.stored("Service", "tiny")["spec"]["selector"][SPEC_HASH_LABEL]
    assert world.api.stored("InferencePool", "tiny")["spec"]["selector"]["matchLabels"][SPEC_HASH_LABEL] == selects
    assert world.last is not None and SyncRouting() in world.last.actions, "the pool is one of the pass's actions"
