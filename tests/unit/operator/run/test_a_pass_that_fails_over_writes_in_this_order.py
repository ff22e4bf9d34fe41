"""The writes of a pass that fails over (recording_kube.py): the standby joins the Service before
anything of the failed active goes, and its replacement comes last."""

from __future__ import annotations

from builders import condition
from pass_world import World, serving


def test_the_standby_is_promoted_before_the_failed_active_is_deleted_and_a_new_standby_created() -> None:
    world = serving(World())
    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)

    world.run()

    writes = [w for w in world.api.writes if w.kind != "Event"]
    assert [(w.verb, w.kind, w.name, w.fields) for w in writes] == [
        ("patch", "Pod", "tiny-0-00002", ("metadata.labels.weightcache.io/role=active",)),
        ("delete", "Pod", "tiny-0-00001", ()),
        ("create", "Pod", "tiny-0-00003", ()),
        ("patch", "WeightCache", "tiny/status", ("status.phase=Ready",)),
    ]
    assert world.role("tiny-0-00003") == "standby"
    failover = world.body["status"]["lastFailover"]
    assert (failover["from"], failover["to"]) == ("tiny-0-00001", "tiny-0-00002")


def test_the_pass_after_a_failover_writes_nothing_while_the_new_standby_starts() -> None:
    world = serving(World())
    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)
    world.run()
    world.api.forget_writes()

    world.run()

    assert world.api.steps() == []


def test_a_daemon_down_past_its_grace_turns_the_gate_false_and_the_standby_takes_over_in_that_same_pass() -> None:
    """The gate the pass turns False is a failover signal to the same pass's plan: one list, the
    gate first, then the promotion, the retirement and the replacement (on node-2, the one Ready
    daemon left), no pass in between."""
    world = serving(World())
    daemon = world.api.stored("Pod", "tiny-daemon-node-1")
    daemon["status"]["conditions"] = [condition("Ready", False, since=0)]  # ten minutes down: past the 30 s grace
    world.api.put("Pod", daemon)

    world.run()

    writes = [w for w in world.api.writes if w.kind != "Event"]
    assert [(w.verb, w.kind, w.name) for w in writes] == [
        ("patch", "Pod", "tiny-0-00001/status"),
        ("patch", "Pod", "tiny-0-00002"),
        ("delete", "Pod", "tiny-0-00001"),
        ("create", "Pod", "tiny-0-00003"),
        ("patch", "WeightCache", "tiny/status"),
    ]
    assert writes[0].fields == ("status.conditions.weightcache.io/daemon-ready=False",)
    assert world.role("tiny-0-00002") == "active"
    failover = world.body["status"]["lastFailover"]
    assert (failover["from"], failover["to"], failover["signal"]) == ("tiny-0-00001", "tiny-0-00002", "DaemonNotReady")
