"""gates.py: the daemon-ready gate is granted only on a Ready daemon of the engine's generation,
kept for a Ready engine through a short outage of the very daemon pod it mapped from, and
refused past the grace, for a replaced, deleted or other-generation daemon, on a NotReady node,
and for an engine that is not Ready itself. alarms.py: one wake-up per key, the earliest."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from weightcache_operator.alarms import Alarms
from weightcache_operator.gates import DAEMON_UID_ANNOTATION, gate_wanted
from weightcache_operator.render import READY_GATE, SPEC_HASH_ANNOTATION
from weightcache_operator.render.layout import CLAIM_ANNOTATION

T0 = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
GRACE = timedelta(seconds=30)


def stamp(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def daemon(
    uid: str = "d1",
    ready: bool = True,
    since: float = 10,
    generation: str = "g1",
    *,
    deleting: bool = False,
    claim: str | None = None,
) -> dict[str, Any]:
    """A daemon pod on node-1, Ready (or NotReady) since T0+since."""
    meta: dict[str, Any] = {"name": f"daemon-{uid}", "uid": uid, "annotations": {SPEC_HASH_ANNOTATION: generation}}
    if deleting:
        meta["deletionTimestamp"] = stamp(since)
    status: dict[str, Any] = {
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": stamp(since)}]
    }
    if claim is not None:
        status["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": claim}]
    return {"metadata": meta, "spec": {"nodeName": "node-1"}, "status": status}


def engine(
    gate: str | None = "True",
    containers_ready: bool = True,
    mapped_from: str | None = "d1",
    generation: str = "g1",
    claim: str | None = None,
) -> dict[str, Any]:
    annotations = {SPEC_HASH_ANNOTATION: generation}
    if mapped_from is not None:
        annotations[DAEMON_UID_ANNOTATION] = mapped_from
    if claim is not None:
        annotations[CLAIM_ANNOTATION] = claim
    conditions = [{"type": "ContainersReady", "status": "True" if containers_ready else "False"}]
    if gate is not None:
        conditions.append({"type": READY_GATE, "status": gate})
    return {
        "metadata": {"name": "e", "annotations": annotations},
        "spec": {"nodeName": "node-1"},
        "status": {"conditions": conditions},
    }


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_granted_on_a_ready_daemon_of_the_engine_s_generation_naming_that_pod() -> None:
    decision = gate_wanted(engine(gate=None, containers_ready=False, mapped_from=None), [daemon()], at(20), GRACE)
    assert (decision.ready, decision.reason, decision.daemon_uid, decision.expires) == (True, "DaemonReady", "d1", None)
    # Among two daemons of a node (one replacing the other) the Ready one of the engine's generation.
    both = [daemon("old", generation="g0"), daemon("new", ready=False), daemon("mine")]
    assert gate_wanted(engine(), both, at(20), GRACE).daemon_uid == "mine"


@pytest.mark.parametrize(
    "daemons",
    [
        pytest.param([], id="no-daemon"),
        pytest.param([daemon(ready=False)], id="daemon-not-ready"),
        pytest.param([daemon(generation="g2")], id="other-generation"),
        pytest.param([daemon(deleting=True)], id="daemon-deleting"),
    ],
)
def test_an_engine_that_has_not_mapped_yet_needs_a_ready_daemon(daemons: list[dict[str, Any]]) -> None:
    starting = engine(gate=None, containers_ready=False, mapped_from=None)
    decision = gate_wanted(starting, daemons, at(20), GRACE)
    assert (decision.ready, decision.reason) == (False, "DaemonNotReady")
    # Not even with a gate left True and the daemon named: its containers are not Ready.
    assert not gate_wanted(engine(containers_ready=False), [daemon(ready=False)], at(20), GRACE).ready


def test_a_ready_engine_keeps_its_gate_through_a_short_outage_of_its_daemon_until_the_grace_ends() -> None:
    down = [daemon(ready=False, since=10)]
    kept = gate_wanted(engine(), down, at(11), GRACE)
    assert (kept.ready, kept.reason, kept.expires, kept.daemon_uid) == (True, "DaemonOutage", at(40), None)
    assert "until 2026-11-29T10:00:40Z" in kept.message
    assert gate_wanted(engine(), down, at(39.9), GRACE).ready
    over = gate_wanted(engine(), down, at(40), GRACE)
    assert (over.ready, over.reason, over.expires) == (False, "DaemonNotReady", None)
    # The daemon back (same pod, restarted container): granted as usual.
    assert gate_wanted(engine(), [daemon(since=14)], at(60), GRACE).reason == "DaemonReady"


@pytest.mark.parametrize(
    ("eng", "daemons", "node_ready", "grace"),
    [
        pytest.param(engine(mapped_from="d0"), [daemon(ready=False)], True, GRACE, id="replaced-daemon-pod"),
        pytest.param(engine(mapped_from=None), [daemon(ready=False)], True, GRACE, id="daemon-pod-not-recorded"),
        pytest.param(engine(), [daemon(ready=False, deleting=True)], True, GRACE, id="daemon-pod-deleting"),
        pytest.param(engine(), [daemon(ready=False, generation="g2")], True, GRACE, id="daemon-of-another-generation"),
        pytest.param(engine(), [daemon(ready=False)], False, GRACE, id="node-not-ready"),
        pytest.param(engine(), [daemon(ready=True)], False, GRACE, id="node-not-ready-daemon-shows-ready"),
        pytest.param(engine(), [daemon(ready=False)], True, timedelta(0), id="grace-zero"),
        pytest.param(engine(gate="False"), [daemon(ready=False)], True, GRACE, id="gate-already-false"),
        pytest.param(engine(containers_ready=False), [daemon(ready=False)], True, GRACE, id="engine-not-ready"),
        pytest.param(engine(), [], True, GRACE, id="daemon-pod-gone"),
    ],
)
def test_the_gate_turns_false_when_the_outage_is_not_one_the_engine_can_ride_out(
    eng: dict[str, Any], daemons: list[dict[str, Any]], node_ready: bool, grace: timedelta
) -> None:
    decision = gate_wanted(eng, daemons, at(11), grace, node_ready=node_ready)
    assert (decision.ready, decision.reason, decision.expires) == (False, "DaemonNotReady", None)


def test_dra_engines_need_the_daemon_whose_claim_they_share() -> None:
    mine = engine(gate=None, containers_ready=False, claim="claim-a")
    assert gate_wanted(mine, [daemon(claim="claim-a")], at(20), GRACE).ready
    assert not gate_wanted(mine, [daemon(claim="claim-b")], at(20), GRACE).ready


# --- alarms ----------------------------------------------------------------------------------------


class Woken:
    def __init__(self) -> None:
        self.keys: list[object] = []
        self.event = threading.Event()

    def __call__(self, key: object) -> None:
        self.keys.append(key)
        self.event.set()


def test_an_alarm_wakes_its_key_once_and_each_setting_replaces_the_last() -> None:
    woken = Woken()
    alarms = Alarms(woken)
    now = datetime.now(UTC)
    alarms.set("a", now + timedelta(seconds=0.1), now)
    alarms.set("a", now + timedelta(seconds=30), now)  # what the latest pass needs: later
    assert alarms.pending("a") == now + timedelta(seconds=30)
    assert not woken.event.wait(0.5), "the replaced alarm fired"
    alarms.set("a", now + timedelta(seconds=0.1), now)
    assert woken.event.wait(5)
    time.sleep(0.2)
    assert woken.keys == ["a"] and alarms.pending("a") is None


def test_a_cancelled_alarm_never_wakes() -> None:
    woken = Woken()
    alarms = Alarms(woken)
    now = datetime.now(UTC)
    alarms.set(("ns", "c"), now + timedelta(seconds=0.2), now)
    alarms.set(("ns", "c"), None, now)  # a pass that keeps no gate
    alarms.set(("ns", "d"), now + timedelta(seconds=0.2), now)
    alarms.cancel(("ns", "d"))
    assert not woken.event.wait(0.6)
    assert woken.keys == []
