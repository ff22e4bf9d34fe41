"""snapshot.Snapshot: what a pass decides on, and how the pass's own changes are written back
into it from the API's answers, so no later step of the pass lists again."""

from __future__ import annotations

from datetime import UTC, datetime

from builders import daemon, daemonset, engine
from weightcache_operator.objects import PodView
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.vocabulary import COMPONENT_LABEL

NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
HASH = "abc"


def test_ready_daemons_are_the_ready_ones_of_the_wanted_spec_by_node_and_slot() -> None:
    snap = Snapshot(
        {},
        None,
        daemon_pods=[
            daemon("d1", node="n1", slot=0, spec_hash=HASH, ready=True),
            daemon("d2", node="n2", slot=1, spec_hash=HASH, ready=True),
            daemon("old", node="n3", spec_hash="zzz", ready=True),
            daemon("down", node="n4", spec_hash=HASH, ready=False),
        ],
    )
    assert sorted(snap.ready_daemons(HASH)) == ["n1", "n2"]
    assert {k: sorted(v) for k, v in snap.ready_daemons_by_slot(HASH, 2).items()} == {0: ["n1"], 1: ["n2"]}
    assert {k: sorted(v) for k, v in snap.ready_daemons_by_slot(HASH, 1).items()} == {0: ["n1", "n2"]}, (
        "an engine of one pod is a group of one: its slot 0 is every node"
    )


def test_the_service_selection_is_none_without_a_service() -> None:
    assert Snapshot({}, None).serving is None
    service = {"spec": {"selector": {"weightcache.io/daemon-spec-hash": HASH}}}
    assert Snapshot({}, None, service=service).serving == HASH


def test_the_passs_own_changes_replace_what_it_saw() -> None:
    snap = Snapshot(
        {},
        None,
        engine_pods=[
            engine("e1", role="standby", spec_hash=HASH, node="n1", ready=True),
            engine("e2", role="standby", spec_hash=HASH, node="n1", ready=True),
        ],
    )
    relabelled = engine("e1", role="standby", spec_hash=HASH, node="n1", ready=True)
    relabelled["metadata"]["labels"]["weightcache.io/role"] = "active"
    snap.pod_changed(relabelled)
    snap.pod_changed(engine("e3", role="standby", spec_hash=HASH, node="n1", ready=True))  # created
    snap.pod_deleted("e2", NOW)
    views = {PodView(p).name: PodView(p) for p in snap.engine_pods}
    assert sorted(views) == ["e1", "e2", "e3"]
    assert views["e1"].role == "active" and views["e2"].deleting and not views["e2"].ready
    snap.daemonset_applied(daemonset("ds", labels={COMPONENT_LABEL: "daemon"}))
    assert [d["metadata"]["name"] for d in snap.daemon_daemonsets] == ["ds"]
    snap.daemonset_deleted("ds")
    assert snap.daemonsets == []
