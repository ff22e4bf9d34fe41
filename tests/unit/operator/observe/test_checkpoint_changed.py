"""A checkpoint that changes under running daemons: the CheckpointChanged condition, its Event, and
with spec.model.onChange: Reload exactly one new daemon generation per change (checkpoint_watch.py),
from DaemonReport objects as the daemons' status endpoints send them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from builders import NOW, daemon, make
from cache_status import condition
from weightcache_contract.daemon_report import CheckpointWatch, DaemonReport, RankReport
from weightcache_operator.observe import checkpoint_watch
from weightcache_operator.plan.reasons import failure_events
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import daemon_daemonset, daemon_spec_hash
from weightcache_operator.spec import WeightCache, WeightCacheStatus

SHARD = "model-00001-of-00002.safetensors"


def report(state: str = "unchanged", files: tuple[str, ...] = (), fingerprint: str = "fp-a") -> DaemonReport:
    """A ready two-rank daemon whose rank 0 watches its checkpoint in ``state``."""
    watch = CheckpointWatch(state=state, changed_files=list(files), detail=f"rank 0: {state}")  # type: ignore[arg-type]
    return DaemonReport(
        cache="tiny",
        ready=True,
        fingerprint=fingerprint,
        ranks=[
            RankReport(rank=0, ready=True, fingerprint="r0", checkpoint=watch),
            RankReport(rank=1, ready=True, fingerprint="r1", checkpoint=CheckpointWatch()),
        ],
    )


def with_status(cache: WeightCache, status: dict[str, Any]) -> WeightCache:
    """``cache`` as the next pass reads it: with the status the last pass wrote."""
    body = cache.model_dump(by_alias=True, mode="json", exclude_none=True)
    body["status"] = {k: v for k, v in status.items() if v is not None}
    return WeightCache.model_validate(body)


def pass_over(cache: WeightCache, reports: dict[str, DaemonReport], hash_of_pods: str | None = None) -> dict[str, Any]:
    """One pass's status with a Ready daemon pod per node of ``reports``, of the generation ``hash_of_pods``
    (the cache's current one unless said)."""
    spec_hash = hash_of_pods or daemon_spec_hash(cache)
    pods = [daemon(node=node, ready=True, spec_hash=spec_hash) for node in reports]
    named = {f"tiny-daemon-{node}": r for node, r in reports.items()}
    status = aggregate(cache, Observed(pods, [], len(reports), daemon_reports=dict(named)), NOW).wire()
    WeightCacheStatus.model_validate(status)
    return status


def test_an_unchanged_checkpoint_starts_no_generation_and_says_so() -> None:
    cache = make(**{"model.onChange": "Reload"})
    status = pass_over(cache, {"node-1": report(), "node-2": report()})
    changed = condition(status, "CheckpointChanged")
    assert (changed["status"], changed["reason"]) == ("False", "Unchanged")
    assert "checkpointReload" not in status
    assert daemon_spec_hash(with_status(cache, status)) == daemon_spec_hash(cache)


def test_a_changed_checkpoint_under_report_is_a_condition_and_an_event_and_nothing_more() -> None:
    cache = make()
    assert cache.spec.model.on_change == "Report", "the default"
    status = pass_over(cache, {"node-1": report("changed", (SHARD,)), "node-2": report("changed", (SHARD,))})
    changed = condition(status, "CheckpointChanged")
    assert (changed["status"], changed["reason"]) == ("True", "FilesChanged")
    assert f"node-1, node-2: {SHARD}" in changed["message"]
    assert "set spec.model.onChange: Reload" in changed["message"], "says what to do"
    assert status["message"] == changed["message"], "the MESSAGE column, when nothing worse is wrong"
    conditions = WeightCacheStatus.model_validate(status).conditions
    assert ("FilesChanged", changed["message"]) in failure_events([], conditions)
    assert failure_events(conditions, conditions) == [], "one Event per change, not per pass"
    assert "checkpointReload" not in status
    assert daemon_spec_hash(with_status(cache, status)) == daemon_spec_hash(cache), "no new generation"


def test_a_changed_checkpoint_under_reload_starts_one_new_generation_not_one_per_pass() -> None:
    cache = make(**{"model.onChange": "Reload"})
    old_hash = daemon_spec_hash(cache)
    first = pass_over(cache, {"node-1": report("changed", (SHARD,)), "node-2": report()})
    changed = condition(first, "CheckpointChanged")
    assert (changed["status"], changed["reason"]) == ("True", "Reloading")
    record = first["checkpointReload"]
    assert (record["nodes"], record["files"], record["seenAt"]) == (["node-1"], [SHARD], "2026-11-29T10:00:00Z")

    # The next pass reads the record: a new generation, rendered into the DaemonSet.
    reloading = with_status(cache, first)
    new_hash = daemon_spec_hash(reloading)
    assert new_hash != old_hash
    template = daemon_daemonset(reloading)["spec"]["template"]
    assert template["metadata"]["labels"]["weightcache.io/daemon-spec-hash"] == new_hash

    # The old daemons still say changed (they serve the old bytes until they go): nothing more starts.
    second = pass_over(reloading, {"node-1": report("changed", (SHARD,)), "node-2": report()}, hash_of_pods=old_hash)
    assert second["checkpointReload"] == record
    assert daemon_spec_hash(with_status(reloading, second)) == new_hash
    assert condition(second, "CheckpointChanged")["reason"] == "Reloaded"

    # The new generation's daemons loaded the new bytes and see no change: still the same generation.
    third = pass_over(with_status(reloading, second), {"node-1": report(fingerprint="fp-b")})
    assert third["checkpointReload"] == record
    assert daemon_spec_hash(with_status(reloading, third)) == new_hash


def test_a_further_change_seen_by_the_new_generation_reloads_again() -> None:
    cache = make(**{"model.onChange": "Reload"})
    first = pass_over(cache, {"node-1": report("changed", (SHARD,))})
    reloaded = with_status(cache, first)
    again = pass_over(reloaded, {"node-1": report("changed", (SHARD,), fingerprint="fp-b")})
    assert again["checkpointReload"]["identity"] != first["checkpointReload"]["identity"]
    assert daemon_spec_hash(with_status(reloaded, again)) not in (daemon_spec_hash(cache), daemon_spec_hash(reloaded))


def test_a_checkpoint_being_verified_changes_nothing_yet() -> None:
    cache = make(**{"model.onChange": "Reload"})
    status = pass_over(cache, {"node-1": report("verifying", (SHARD,)), "node-2": report()})
    changed = condition(status, "CheckpointChanged")
    assert (changed["status"], changed["reason"]) == ("False", "Verifying")
    assert changed["message"].startswith("node-1: ") and "rank 0: verifying" in changed["message"]
    conditions = WeightCacheStatus.model_validate(status).conditions
    assert "checkpointReload" not in status and failure_events([], conditions) == []
    assert daemon_spec_hash(with_status(cache, status)) == daemon_spec_hash(cache)


def test_switching_to_reload_while_changed_reloads_and_switching_back_keeps_the_generation() -> None:
    reported = {"node-1": report("changed", (SHARD,))}
    cache = make()
    assert "checkpointReload" not in pass_over(cache, reported)
    assert daemon_spec_hash(make(**{"model.onChange": "Reload"})) == daemon_spec_hash(cache), (
        "onChange is no generation"
    )
    reloading = make(**{"model.onChange": "Reload"})
    status = pass_over(reloading, reported)
    back = make(**{"model.onChange": "Report"})
    assert daemon_spec_hash(with_status(back, status)) == daemon_spec_hash(with_status(reloading, status))


def test_the_change_names_files_once_per_node_set_and_cuts_long_lists() -> None:
    many = tuple(f"model-{i:05d}.safetensors" for i in range(25))
    seen = checkpoint_watch.observe({"node-2": report("changed", many), "node-1": report("changed", (SHARD,))})
    status, reason, message = checkpoint_watch.condition_fields(seen, "Report", None)
    assert (status, reason) == ("True", "FilesChanged")
    assert f"node-1: {SHARD}; node-2: model-00000.safetensors" in message and "and 5 more" in message
    record = checkpoint_watch.reload_record(seen, "Reload", None, NOW + timedelta(seconds=1))
    assert record is not None and len(record["files"]) == checkpoint_watch.MAX_FILES
    assert checkpoint_watch.reload_record(seen, "Reload", record, NOW) == record, "the same change: kept"


def test_the_engine_planner_takes_a_recorded_change_for_a_generation_change_and_rolls_onto_it() -> None:
    """The existing path moves the engines: the engines and daemons of the generation before the
    record are outdated once the record is read."""
    from engine_snapshots import CACHE, engine, snapshot
    from weightcache_operator.plan.engine_plan import desired, plan_engines

    converged = snapshot(engine("a0", "active"), engine("s0", "standby"))
    assert plan_engines(CACHE, converged, desired(CACHE), NOW, apply_service=False).rollout.mode is None
    reloading = with_status(
        CACHE, {"checkpointReload": {"identity": "0123456789abcdef", "nodes": ["node-1"], "files": [SHARD]}}
    )
    want = desired(reloading)
    assert want.daemon_hash != daemon_spec_hash(CACHE)
    plan = plan_engines(reloading, converged, want, NOW, apply_service=False)
    assert plan.rollout.mode == "Generation" and plan.rollout.phase == "Progressing", plan.rollout
    assert plan.rollout.serve_hash == daemon_spec_hash(CACHE), "the old generation serves until the new one is Ready"
