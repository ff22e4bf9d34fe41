"""objects: typed views over API objects, timestamps and conditions, read one way everywhere."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

from weightcache_operator.objects import NodeView, PodView, condition, parse_time, stamp

T0 = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)

POD = {
    "metadata": {
        "name": "e-1",
        "namespace": "ns",
        "uid": "u1",
        "creationTimestamp": "2026-11-29T10:00:00Z",
        "labels": {"weightcache.io/replica": "2", "weightcache.io/role": "active"},
        "annotations": {"weightcache.io/daemon-spec-hash": "abc"},
        "ownerReferences": [{"name": "ds", "controller": True}],
    },
    "spec": {"nodeName": "node-1"},
    "status": {
        "phase": "Running",
        "podIP": "10.0.0.1",
        "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-29T10:00:05Z"}],
    },
}


def test_a_pod_view_reads_what_decisions_use_and_changes_nothing() -> None:
    raw = copy.deepcopy(POD)
    pod = PodView(raw)
    assert (pod.name, pod.namespace, pod.uid, pod.node, pod.phase, pod.ip) == (
        "e-1",
        "ns",
        "u1",
        "node-1",
        "Running",
        "10.0.0.1",
    )
    assert (pod.replica, pod.role, pod.spec_hash, pod.owner) == (2, "active", "abc", "ds")
    assert pod.created == T0 and pod.ready and not pod.deleting and not pod.terminal
    assert raw == POD


def test_a_terminating_pod_is_not_ready_even_with_ready_true() -> None:
    raw = copy.deepcopy(POD)
    raw["metadata"]["deletionTimestamp"] = "2026-11-29T10:01:00Z"
    assert not PodView(raw).ready and PodView(raw).deletion == T0 + timedelta(minutes=1)


def test_a_view_of_an_empty_object_answers_with_nothing_rather_than_failing() -> None:
    pod = PodView({})
    assert (pod.name, pod.node, pod.replica, pod.role, pod.created, pod.ready) == ("", None, None, None, None, False)
    assert not NodeView({}).ready and NodeView({}).ready_changed is None


def test_timestamps_parse_with_or_without_fractions_and_stamp_back_to_seconds() -> None:
    assert parse_time("2026-11-29T10:00:00Z") == T0
    assert parse_time("2026-11-29T10:00:00.250000Z") == T0 + timedelta(milliseconds=250)
    assert parse_time(None) is None and parse_time("") is None
    assert stamp(T0 + timedelta(milliseconds=250)) == "2026-11-29T10:00:00Z"


def test_a_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    before = [condition("Available", True, "Up", "ok", T0)]
    later = T0 + timedelta(minutes=5)
    same = condition("Available", True, "StillUp", "ok", later, before, observedGeneration=3)
    assert same == {
        "type": "Available",
        "status": "True",
        "reason": "StillUp",
        "message": "ok",
        "lastTransitionTime": "2026-11-29T10:00:00Z",
        "observedGeneration": 3,
    }
    flipped = condition("Available", False, "Down", "no", later, before)
    assert flipped["lastTransitionTime"] == "2026-11-29T10:05:00Z"
    assert condition("Other", "True", "R", "m", later, before)["lastTransitionTime"] == "2026-11-29T10:05:00Z"
