"""status.aggregate during a daemon generation change: a cache whose old generation serves while the
new one loads is Ready, and GenerationChange (with status.generationChange for the printer column)
says what changes; a failure of the change still makes it Degraded or Failed, and a cache with no
Ready active still says Loading."""

from __future__ import annotations

from typing import Any

from builders import NOW, container_status, daemon, engine, make, terminated
from weightcache_operator.plan.status import ChangeUnderWay, Observed, aggregate, invalid_status
from weightcache_operator.render import daemon_spec_hash
from weightcache_operator.spec import WeightCacheStatus

CACHE = make()
NEW = daemon_spec_hash(CACHE)
BLUE_GREEN = ChangeUnderWay("BlueGreen", "every daemon has room for a second copy", "loading", 0, 1)


def old_generation_serving() -> list[dict[str, Any]]:
    """The old generation's daemon and its Ready active and standby."""
    return [
        daemon("tiny-daemon-old", ready=True, spec_hash="old"),
        engine("tiny-0-a", role="active", ready=True, spec_hash="old"),
        engine("tiny-0-b", role="standby", ready=True, spec_hash="old"),
    ]


def observed(*pods: dict[str, Any], change: ChangeUnderWay | None = BLUE_GREEN) -> Observed:
    daemons = [p for p in pods if "daemon" in p["metadata"]["name"]]
    engines = [p for p in pods if p not in daemons]
    return Observed(daemons, engines, 1, change=change)


def condition(status: dict[str, Any], kind: str) -> tuple[str, str, str]:
    found = next(c for c in status["conditions"] if c["type"] == kind)
    return found["status"], found["reason"], found["message"]


def test_a_cache_whose_old_generation_serves_while_the_new_one_loads_is_ready_and_says_what_changes() -> None:
    loading = daemon("tiny-daemon-new", node="node-1", ready=False, spec_hash=NEW)
    status = aggregate(CACHE, observed(*old_generation_serving(), loading), NOW).wire()
    assert status["phase"] == "Ready" and status["generationChange"] == "BlueGreen"
    assert condition(status, "DaemonsReady")[:2] == ("False", "Loading"), "the conditions stay exact"
    state, reason, message = condition(status, "GenerationChange")
    assert (state, reason) == ("True", "BlueGreen")
    assert message.startswith(f"daemon generation old -> {NEW[:10]}: 0/1 replicas whole on the new one; loading")
    assert message.endswith("(BlueGreen: every daemon has room for a second copy)")


def test_without_a_change_under_way_the_same_pods_say_ready_with_no_change_named() -> None:
    loading = daemon("tiny-daemon-new", node="node-1", ready=False, spec_hash=NEW)
    status = aggregate(CACHE, observed(*old_generation_serving(), loading, change=None), NOW).wire()
    assert status["phase"] == "Ready" and status["generationChange"] is None
    assert condition(status, "DaemonsReady")[0] == "False"
    assert "GenerationChange" not in {c["type"] for c in status["conditions"]}, "none before the first change"


def test_a_change_with_no_ready_active_still_says_loading() -> None:
    pods = [
        daemon("tiny-daemon-new", node="node-1", ready=False, spec_hash=NEW),
        engine("tiny-0-a", role="active", ready=False, spec_hash="old"),
    ]
    status = aggregate(CACHE, observed(*pods), NOW).wire()
    assert status["phase"] == "Loading" and condition(status, "GenerationChange")[:2] == ("True", "BlueGreen")


def test_a_crash_looping_new_daemon_makes_the_change_degraded_though_the_old_generation_serves() -> None:
    looping = daemon(
        "tiny-daemon-new",
        node="node-1",
        ready=False,
        spec_hash=NEW,
        containers=[container_status("main", waiting="CrashLoopBackOff")],
    )
    status = aggregate(CACHE, observed(*old_generation_serving(), looping), NOW).wire()
    assert status["phase"] == "Degraded" and condition(status, "Degraded")[:2] == ("True", "CrashLoop")
    assert status["generationChange"] == "BlueGreen"


def test_a_new_generation_every_node_refuses_is_degraded_while_the_old_one_serves_and_failed_without() -> None:
    refused = daemon("tiny-daemon-new", node="node-1", ready=False, spec_hash=NEW)
    ended = terminated(2, "the ranks do not fit on this node")
    refused["status"]["containerStatuses"] = [container_status("daemon", restarts=1, exited=ended)]
    serving = aggregate(CACHE, observed(*old_generation_serving(), refused), NOW).wire()
    assert serving["phase"] == "Degraded" and condition(serving, "Degraded")[:2] == ("True", "Refused")
    alone = aggregate(CACHE, observed(refused), NOW).wire()
    assert alone["phase"] == "Failed"


def test_after_the_change_the_condition_turns_false_and_the_column_clears() -> None:
    during = aggregate(CACHE, observed(*old_generation_serving()), NOW)
    pods = [
        daemon("tiny-daemon-new", ready=True, spec_hash=NEW),
        engine("tiny-0-c", role="active", ready=True, spec_hash=NEW),
        engine("tiny-0-d", role="standby", ready=True, spec_hash=NEW),
    ]
    after = aggregate(CACHE, observed(*pods, change=None), NOW, during.conditions).wire()
    assert after["phase"] == "Ready" and after["generationChange"] is None
    assert condition(after, "GenerationChange")[:2] == ("False", "Converged")


def test_an_invalid_spec_clears_the_change_column_too() -> None:
    status = invalid_status(3, ["spec.model: wrong"], NOW, base=WeightCacheStatus(generation_change="BlueGreen"))
    assert status.wire()["generationChange"] is None and status.phase == "Failed"
