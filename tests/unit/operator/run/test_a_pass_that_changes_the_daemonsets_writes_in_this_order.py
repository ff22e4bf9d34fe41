"""The DaemonSet writes of a spec change (recording_kube.py): what the daemons wait for goes
first, then the daemons, all before the engines' writes; what is no longer wanted goes last,
after what replaces it and after the engines that mapped from it."""

from __future__ import annotations

from builders import BASE, changed
from pass_world import World, serving


def test_the_gpu_holder_is_applied_before_the_daemons_that_wait_for_its_grant() -> None:
    world = World(changed(BASE, **{"daemon.backend": "cuda-vmm"}))

    world.run(apply=True)

    assert world.api.steps() == [
        ("create", "Secret", "tiny-seeding"),
        ("apply", "ConfigMap", "tiny-seed-peers"),
        ("apply", "DaemonSet", "tiny-gpus"),
        ("apply", "DaemonSet", "tiny-daemon"),
        ("apply", "Service", "tiny"),
        ("apply", "PodDisruptionBudget", "tiny-active"),
        ("patch", "WeightCache", "tiny/status"),
    ]


def test_the_gpu_holder_is_deleted_after_the_daemons_stop_reading_its_grant() -> None:
    world = World(changed(BASE, **{"daemon.backend": "cuda-vmm"}))
    world.run(apply=True)
    world.change_spec(**{"daemon.backend": "cpu-shm"})
    world.api.forget_writes()

    world.run(apply=True)

    assert world.api.steps() == [
        ("apply", "DaemonSet", "tiny-daemon"),
        ("delete", "DaemonSet", "tiny-gpus"),
        ("patch", "WeightCache", "tiny/status"),
    ]


def test_a_new_layout_applies_the_slot_daemonsets_then_moves_the_engines_then_deletes_the_old_one() -> None:
    world = serving(World())
    world.change_spec(**{"parallelism.nodes": 2})

    world.run(apply=True)

    assert world.api.steps() == [
        ("apply", "DaemonSet", "tiny-daemon-0"),
        ("apply", "DaemonSet", "tiny-daemon-1"),
        ("apply", "Service", "tiny"),
        ("apply", "PodDisruptionBudget", "tiny-active"),
        ("delete", "Pod", "tiny-0-00001"),
        ("delete", "Pod", "tiny-0-00002"),
        ("delete", "DaemonSet", "tiny-daemon"),
        ("patch", "WeightCache", "tiny/status"),
    ]
