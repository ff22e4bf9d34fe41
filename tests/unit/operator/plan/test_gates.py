"""gates.py: the daemon-ready gate is granted only on a Ready daemon of the engine's generation,
kept for a Ready engine through a short outage of the very daemon pod it mapped from, and
refused past the grace, for a replaced, deleted or other-generation daemon, on a NotReady node,
and for an engine that is not Ready itself. alarms.py: one wake-up per key, the earliest."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import pytest
from builders import after, daemon, engine
from weightcache_operator.plan.gates import gate_wanted
from weightcache_operator.run.alarms import Alarms

GRACE = timedelta(seconds=30)


node_daemon = partial(daemon, uid="d1", ready=True, ready_since=10, spec_hash="g1")
"""The daemon pod d1 on node-1, of generation g1, Ready since NOW+10."""

mapped_engine = partial(engine, "e", spec_hash="g1", gate="True", containers_ready=True, mapped_from="d1")
"""An engine of generation g1 on node-1 that mapped from daemon d1, its containers and gate Ready."""


def test_granted_on_a_ready_daemon_of_the_engine_s_generation_naming_that_pod() -> None:
    decision = gate_wanted(
        mapped_engine(gate=None, containers_ready=False, mapped_from=None), [node_daemon()], after(20), GRACE
    )
    assert (decision.ready, decision.reason, decision.daemon_uid, decision.expires) == (True, "DaemonReady", "d1", None)
    # Among two daemons of a node (one replacing the other) the Ready one of the engine's generation.
    both = [node_daemon(uid="old", spec_hash="g0"), node_daemon(uid="new", ready=False), node_daemon(uid="mine")]
    assert gate_wanted(mapped_engine(), both, after(20), GRACE).daemon_uid == "mine"


@pytest.mark.parametrize(
    "daemons",
    [
        pytest.param([], id="no-daemon"),
        pytest.param([node_daemon(ready=False)], id="daemon-not-ready"),
        pytest.param([node_daemon(spec_hash="g2")], id="other-generation"),
        pytest.param([node_daemon(deleted=10)], id="daemon-deleting"),
    ],
)
def test_an_engine_that_has_not_mapped_yet_needs_a_ready_daemon(daemons: list[dict[str, Any]]) -> None:
    starting = mapped_engine(gate=None, containers_ready=False, mapped_from=None)
    decision = gate_wanted(starting, daemons, after(20), GRACE)
    assert (decision.ready, decision.reason) == (False, "DaemonNotReady")
    # Not even with a gate left True and the daemon named: its containers are not Ready.
    assert not gate_wanted(mapped_engine(containers_ready=False), [node_daemon(ready=False)], after(20), GRACE).ready


def test_a_ready_engine_keeps_its_gate_through_a_short_outage_of_its_daemon_until_the_grace_ends() -> None:
    down = [node_daemon(ready=False, ready_since=10)]
    kept = gate_wanted(mapped_engine(), down, after(11), GRACE)
    assert (kept.ready, kept.reason, kept.expires, kept.daemon_uid) == (True, "DaemonOutage", after(40), None)
    assert "until 2026-11-29T10:00:40Z" in kept.message
    assert gate_wanted(mapped_engine(), down, after(39.9), GRACE).ready
    over = gate_wanted(mapped_engine(), down, after(40), GRACE)
    assert (over.ready, over.reason, over.expires) == (False, "DaemonNotReady", None)
    # The daemon back (same pod, restarted container): granted as usual.
    assert gate_wanted(mapped_engine(), [node_daemon(ready_since=14)], after(60), GRACE).reason == "DaemonReady"


@pytest.mark.parametrize(
    ("eng", "daemons", "node_ready", "grace"),
    [
        pytest.param(
            mapped_engine(mapped_from="d0"), [node_daemon(ready=False)], True, GRACE, id="replaced-daemon-pod"
        ),
        pytest.param(
            mapped_engine(mapped_from=None), [node_daemon(ready=False)], True, GRACE, id="daemon-pod-not-recorded"
        ),
        pytest.param(mapped_engine(), [node_daemon(ready=False, deleted=10)], True, GRACE, id="daemon-pod-deleting"),
        pytest.param(
            mapped_engine(), [node_daemon(ready=False, spec_hash="g2")], True, GRACE, id="daemon-of-another-generation"
        ),
        pytest.param(mapped_engine(), [node_daemon(ready=False)], False, GRACE, id="node-not-ready"),
        pytest.param(mapped_engine(), [node_daemon(ready=True)], False, GRACE, id="node-not-ready-daemon-shows-ready"),
        pytest.param(mapped_engine(), [node_daemon(ready=False)], True, timedelta(0), id="grace-zero"),
        pytest.param(mapped_engine(gate="False"), [node_daemon(ready=False)], True, GRACE, id="gate-already-false"),
        pytest.param(
            mapped_engine(containers_ready=False), [node_daemon(ready=False)], True, GRACE, id="engine-not-ready"
        ),
        pytest.param(mapped_engine(), [], True, GRACE, id="daemon-pod-gone"),
    ],
)
def test_the_gate_turns_false_when_the_outage_is_not_one_the_engine_can_ride_out(
    eng: dict[str, Any], daemons: list[dict[str, Any]], node_ready: bool, grace: timedelta
) -> None:
    decision = gate_wanted(eng, daemons, after(11), grace, node_ready=node_ready)
    assert (decision.ready, decision.reason, decision.expires) == (False, "DaemonNotReady", None)


def test_dra_engines_need_the_daemon_whose_claim_they_share() -> None:
    mine = mapped_engine(gate=None, containers_ready=False, claim="claim-a")
    assert gate_wanted(mine, [node_daemon(claim="claim-a")], after(20), GRACE).ready
    assert not gate_wanted(mine, [node_daemon(claim="claim-b")], after(20), GRACE).ready


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
