"""A pass returns what it did: the actions it carried out, in order, and the status it wrote as
the CRD's typed ``WeightCacheStatus`` (which forbids unknown fields), so what the operator writes
and the schema it publishes agree pass by pass, through creation, serving, a failover and a spec
change. On the wire every time keeps its field's precision, and a status read back and written
again is unchanged (else each pass would patch it anew)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pass_world import World, serving
from weightcache_operator.plan.actions import (
    ApplyDaemonSet,
    ApplySeedPeers,
    ApplyService,
    CreateSeedingSecret,
    Failover,
    RecountBudget,
    SetRole,
    SyncRouting,
)
from weightcache_operator.run.reconcile import PassResult
from weightcache_operator.spec.status import WeightCacheStatus


def _did(world: World) -> PassResult:
    """What the last pass returned, its status checked against what the API now stores: every
    field it set to a value is stored so, and the stored status as a whole still parses."""
    assert world.last is not None
    stored = world.body["status"]
    for field, value in world.last.status.wire().items():
        if value is not None and not isinstance(value, dict):  # objects are merged into the old
            assert stored[field] == value, field
    WeightCacheStatus.model_validate(stored)
    return world.last


def test_each_pass_from_creation_to_a_failover_and_a_spec_change_returns_its_actions_and_the_status_it_wrote() -> None:
    world = World()
    world.run(apply=True)
    created = _did(world)
    assert created.status.phase == "Pending"
    assert [type(a) for a in created.actions] == [
        CreateSeedingSecret,
        ApplySeedPeers,
        ApplyDaemonSet,
        ApplyService,
        SyncRouting,
        RecountBudget,
    ]

    serving(world)
    world.run()  # nothing to change: only the routing's and the budget's checks, which write nothing here
    settled = _did(world)
    assert settled.status.phase == "Ready" and settled.actions == (SyncRouting(), RecountBudget(demoted=False))

    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)
    world.run()
    failed_over = _did(world)
    assert failed_over.status.last_failover is not None and failed_over.status.last_failover.from_ == "tiny-0-00001"
    kinds = [type(a) for a in failed_over.actions]
    assert SetRole in kinds and Failover in kinds and kinds.index(SetRole) < kinds.index(Failover)

    world.change_spec(**{"engine.args": ["--max-model-len", "512"]})
    world.run(apply=True)
    assert _did(world).status.observed_generation == world.body["metadata"]["generation"]


def _every_time_set(at: datetime) -> dict[str, Any]:
    """A status with each of its time fields at ``at``, as the operator could write it."""
    text = at.isoformat().replace("+00:00", "Z")
    return {
        "phase": "Ready",
        "conditions": [{"type": "Available", "status": "True", "lastTransitionTime": text}],
        "checkpointReload": {"identity": "abc", "seenAt": text},
        "rollout": {
            "phase": "Complete",
            "startedAt": text,
            "finishedAt": text,
            "replicas": [{"replica": 0, "engine": "e", "promotedAt": text, "retiredAt": text}],
        },
        "lastEngineStart": {"pod": "e", "createdAt": text, "readyAt": text, "readySeconds": 1.5},
        "lastFailover": {"time": text, "replica": 0, "to": "e", "promotionMs": 3.2, "failureApiSecond": text},
    }


def test_on_the_wire_each_time_keeps_its_fields_precision_and_reads_back_unchanged() -> None:
    wire = WeightCacheStatus.model_validate(_every_time_set(datetime(2026, 12, 4, 10, 26, 22, 123456, UTC))).wire()

    seconds, milliseconds, microseconds = (
        "2026-12-04T10:26:22Z",
        "2026-12-04T10:26:22.123Z",
        "2026-12-04T10:26:22.123456Z",
    )
    assert wire["conditions"][0]["lastTransitionTime"] == seconds
    assert wire["checkpointReload"]["seenAt"] == seconds
    assert (wire["rollout"]["startedAt"], wire["rollout"]["finishedAt"]) == (seconds, seconds)
    assert wire["rollout"]["replicas"][0]["promotedAt"] == wire["rollout"]["replicas"][0]["retiredAt"] == milliseconds
    assert (wire["lastEngineStart"]["createdAt"], wire["lastEngineStart"]["readyAt"]) == (seconds, seconds)
    assert wire["lastFailover"]["time"] == microseconds
    assert wire["lastFailover"]["failureApiSecond"] == seconds
    assert WeightCacheStatus.model_validate(wire).wire() == wire


def test_on_the_wire_only_the_fields_set_are_written_and_a_field_set_to_none_is_a_delete() -> None:
    wire = WeightCacheStatus.model_validate({"phase": "Pending", "inferencePool": None}).wire()

    assert wire == {"phase": "Pending", "inferencePool": None}
