"""The writes of the passes that bring a new cache up, in the order the API server receives them
(recording_kube.py): what exists first is what the next object needs."""

from __future__ import annotations

from pass_world import World


def test_the_first_pass_creates_the_seeding_secret_and_peers_file_then_applies_the_daemonset_the_service_and_its_budget_then_the_status() -> (
    None
):
    world = World()

    assert world.run(apply=True) == "Pending"

    assert world.api.steps() == [
        ("create", "Secret", "tiny-seeding"),
        ("apply", "ConfigMap", "tiny-seed-peers"),
        ("apply", "DaemonSet", "tiny-daemon"),
        ("apply", "Service", "tiny"),
        ("apply", "PodDisruptionBudget", "tiny-active"),
        ("patch", "WeightCache", "tiny/status"),
    ]


def test_engines_are_created_once_daemons_are_ready_the_active_first() -> None:
    world = World()
    world.run(apply=True)
    world.api.forget_writes()
    world.daemons_run()

    assert world.run() == "Loading"

    assert world.api.steps() == [
        ("create", "Pod", "tiny-0-00001"),
        ("create", "Pod", "tiny-0-00002"),
        ("patch", "WeightCache", "tiny/status"),
    ]
    assert [world.role(n) for n in ("tiny-0-00001", "tiny-0-00002")] == ["active", "standby"]


def test_a_scheduled_engine_is_told_its_daemon_before_its_gate_opens_and_before_the_status() -> None:
    world = World()
    world.run(apply=True)
    world.daemons_run()
    world.run()
    world.api.forget_writes()
    world.placed()

    assert world.run() == "Ready"

    writes = [w for w in world.api.writes if w.kind != "Event"]
    assert [(w.verb, w.name, w.fields) for w in writes] == [
        ("patch", "tiny-0-00001", ("metadata.annotations.weightcache.io/daemon-uid=uid-tiny-daemon-node-1-1",)),
        ("patch", "tiny-0-00001/status", ("status.conditions.weightcache.io/daemon-ready=True",)),
        ("patch", "tiny-0-00002", ("metadata.annotations.weightcache.io/daemon-uid=uid-tiny-daemon-node-1-1",)),
        ("patch", "tiny-0-00002/status", ("status.conditions.weightcache.io/daemon-ready=True",)),
        ("patch", "tiny/status", ("status.phase=Ready",)),
    ]


def test_a_pass_over_a_ready_cache_writes_nothing() -> None:
    world = World()
    world.run(apply=True)
    world.daemons_run()
    world.run()
    world.placed()
    world.run()
    world.api.forget_writes()

    world.run(apply=True)

    assert world.api.steps() == []
