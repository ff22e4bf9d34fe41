"""status.lastFailover's durations come from the operator's own clock (sightings.py), never from
the API server's timestamps, which are truncated to the second: a deletion at .9 s is stamped .0,
and "stamp → pass" read 0.9 s for a failover the operator finished in milliseconds."""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

from builders import after, at
from replica_plans import plan_replica, running_engine
from weightcache_operator.observe.sightings import Sightings
from weightcache_operator.plan.actions import Promotion
from weightcache_operator.plan.failover import failover_status
from weightcache_operator.spec import WeightCacheStatus
from weightcache_operator.vocabulary import COMPONENT_LABEL

KEY = ("ns", "tiny")
HASH = "h1"


watched = partial(running_engine, labels={COMPONENT_LABEL: "engine"})
"""A running engine pod with the component label sightings go by."""


def record(
    sightings: Sightings, pods: list[dict[str, Any]], noticed: datetime, promoted: datetime, **saw: Any
) -> dict[str, Any]:
    """One pass at ``noticed`` (it began reading 2 ms before): what it saw, planned and recorded."""
    unready, unresponsive = saw.get("unready", {}), saw.get("unresponsive", {})
    sightings.saw(KEY, pods, unready, unresponsive, noticed - timedelta(milliseconds=2), noticed)
    plan = plan_replica(0, pods, 1, HASH, unready, unresponsive)
    assert plan.promotion is not None
    entry = failover_status(plan.promotion, noticed, promoted, sightings.first(KEY, plan.promotion.failed_pods)).wire()
    WeightCacheStatus.model_validate({"lastFailover": entry})  # what the CRD accepts
    return entry


def test_a_deletion_stamped_to_the_second_is_timed_from_the_operators_first_sight_not_its_stamp() -> None:
    sightings = Sightings()
    standby = watched("s", role="standby", node="node-2", created=1)
    # Deleted at 10:01:00.900; the API stamps deletionTimestamp 10:01:30 (grace 30), the request's
    # own second, 10:01:00, with the 0.9 s cut off.
    active = watched("a", role="active", deleted=60.9, grace=30)
    sightings.pod_event(KEY, active, after(60.905))  # the watch event's arrival
    entry = record(sightings, [active, standby], noticed=after(60.910), promoted=after(60.925))
    assert entry["signal"] == "PodDeleted"
    assert (entry["detectionMs"], entry["promotionMs"]) == (5.0, 15.0), entry
    # First sight never comes before the failure itself (measured from the stamp, it came 0.9 s before).
    first_sight = after(60.910) - timedelta(milliseconds=entry["detectionMs"])
    assert first_sight >= after(60.9)
    # The stamp is still there, as what it is: a whole second.
    assert entry["failureApiSecond"] == "2026-11-29T10:01:00Z"


def test_a_failure_that_came_before_the_operator_is_first_seen_by_its_first_pass_and_its_age_is_in_the_stamp() -> None:
    sightings = Sightings()  # an operator just started: nothing seen yet
    active = watched("a", role="active", ready=False, ready_since=60)
    active["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(60)}}
    entry = record(
        sightings, [active, watched("s", role="standby", created=1)], noticed=after(360.5), promoted=after(360.52)
    )
    assert entry["signal"] == "ContainerRestarted" and entry["detectionMs"] == 0.0
    assert entry["failureApiSecond"] == "2026-11-29T10:01:00Z", "five minutes before the operator's first sight"


def test_a_node_gone_not_ready_is_timed_from_its_node_event() -> None:
    sightings = Sightings()
    active, standby = watched("a", role="active"), watched("s", role="standby", node="node-2", created=1)
    sightings.node_event("node-1", False, after(80.1))
    entry = record(
        sightings, [active, standby], noticed=after(80.13), promoted=after(80.15), unready={"node-1": after(80)}
    )
    assert (entry["signal"], entry["detectionMs"], entry["failureApiSecond"]) == (
        "NodeNotReady",
        30.0,
        "2026-11-29T10:01:20Z",
    )


def test_a_frozen_engine_is_timed_from_the_first_probe_it_left_unanswered() -> None:
    sightings = Sightings()
    active, standby = watched("a", role="active"), watched("s", role="standby", node="node-2", created=1)
    silent = {"a": after(70.25)}
    entry = record(sightings, [active, standby], noticed=after(70.66), promoted=after(70.67), unresponsive=silent)
    # The 400 ms of silence the verdict waits for is detection too; the API has no stamp for it.
    assert entry["signal"] == "Unresponsive" and entry["detectionMs"] == 410.0
    assert "failureApiSecond" not in entry


def test_a_pod_that_served_again_is_timed_from_its_new_failure() -> None:
    sightings = Sightings()
    crashed = watched("a", role="active", ready=False, started=21, ready_since=20)
    crashed["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"finishedAt": at(20)}}
    sightings.pod_event(KEY, crashed, after(20.3))
    sightings.pod_event(KEY, watched("a", role="active", started=21, ready_since=25), after(25.1))  # Ready again
    assert sightings.first(KEY, [crashed]) is None
    # Failing again, first seen by a pass this time: timed from that pass, not from 20.3 s.
    again = watched("a", role="active", ready=False, started=21, ready_since=90)
    entry = record(
        sightings, [again, watched("s", role="standby", created=1)], noticed=after(90.4), promoted=after(90.41)
    )
    assert (entry["signal"], entry["detectionMs"]) == ("ReadinessFailed", 0.0)


def test_a_pass_that_saw_a_pod_healthy_drops_only_sightings_older_than_its_reading() -> None:
    sightings = Sightings()
    healthy, failing = watched("a", role="active"), watched("a", role="active", deleted=50.2, grace=30)
    sightings.pod_event(KEY, failing, after(50.21))
    # A pass that began reading at 50.2 read the pod before the deletion: its view is older than the event.
    sightings.saw(KEY, [healthy], {}, {}, after(50.2), after(50.22))
    assert sightings.first(KEY, [failing]) == after(50.21)
    # One that began after the event and still saw it healthy knows better.
    sightings.saw(KEY, [healthy], {}, {}, after(50.3), after(50.31))
    assert sightings.first(KEY, [failing]) is None


def test_a_pod_gone_from_a_pass_is_forgotten_and_other_caches_keep_theirs() -> None:
    sightings = Sightings()
    gone, other = watched("a", role="active", deleted=10, grace=30), watched("b", role="active", deleted=10, grace=30)
    sightings.pod_event(KEY, gone, after(10.1))
    sightings.pod_event(("ns", "other"), other, after(10.1))
    sightings.saw(KEY, [], {}, {}, after(11), after(11.01))
    assert sightings.first(KEY, [gone]) is None
    assert sightings.first(("ns", "other"), [other]) == after(10.1)


def test_an_engine_group_is_timed_from_the_first_of_its_pods_seen_failing() -> None:
    sightings = Sightings()
    leader, follower = watched("g-0", role="active"), watched("g-1", role="active", deleted=30, grace=30)
    sightings.pod_event(KEY, follower, after(30.2))
    sightings.pod_event(KEY, watched("g-0", role="active", deleted=30.5, grace=30), after(30.6))
    assert sightings.first(KEY, [leader, follower]) == after(30.2)


def test_daemon_pods_and_healthy_events_record_nothing() -> None:
    sightings = Sightings()
    daemon = watched("d", role="active", deleted=5, grace=30)
    daemon["metadata"]["labels"][COMPONENT_LABEL] = "daemon"
    sightings.pod_event(KEY, daemon, after(5.1))
    sightings.pod_event(KEY, watched("a", role="active"), after(5.1))
    assert sightings.first(KEY, [daemon, watched("a", role="active")]) is None


def test_a_promotion_over_no_failure_has_no_detection() -> None:
    entry = failover_status(Promotion(0, watched("s", role="standby"), None, None), after(1), after(1.01), None).wire()
    assert "detectionMs" not in entry and "failureApiSecond" not in entry
