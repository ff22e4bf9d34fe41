"""Passes read a cache's DaemonSets, Services and disruption budget from the watches (watch_index.py)
like its pods: only once each watch has delivered what the cache's earlier passes wrote of that
kind, and a LIST has checked the cache since that watch listed; otherwise the pass LISTs that
kind. Each test is one way a stale view could make a pass apply from an older state than its own
last write."""

from __future__ import annotations

import copy
from typing import Any

from builders import BASE
from recording_kube import RecordingKube
from weightcache_operator.objects import Object
from weightcache_operator.observe.node_index import NodeIndex
from weightcache_operator.observe.snapshot import Snapshot, observe
from weightcache_operator.observe.watch_index import Watches
from weightcache_operator.vocabulary import CACHE_LABEL, COMPONENT_LABEL

DAEMONSETS = "/apis/apps/v1/namespaces/ns/daemonsets"
BUDGETS = "/apis/policy/v1/namespaces/ns/poddisruptionbudgets"


class Cluster:
    """The recording API with the cache stored, and the operator's watches fed by hand."""

    def __init__(self) -> None:
        self.api = RecordingKube()
        self.api.put("WeightCache", BASE)
        self.watches = Watches()
        self.sources: dict[str, str] = {}

    def put(self, kind: str, name: str, component: str, **spec: Any) -> Object:
        labels = {CACHE_LABEL: "tiny", COMPONENT_LABEL: component}
        return self.api.put(kind, {"metadata": {"name": name, "labels": labels, "uid": f"uid-{name}"}, "spec": spec})

    def deliver(self, kind: str, name: str) -> None:
        """The watch of ``kind`` delivers the object as stored now."""
        index = {"DaemonSet": self.watches.daemonsets, "Service": self.watches.services}.get(kind)
        (index or self.watches.budgets).put(copy.deepcopy(self.api.stored(kind, name)))

    def look(self, *, watched: bool = True) -> Snapshot:
        """One observation, as a pass a pod event triggers (``watched``) or a full pass makes."""
        self.sources = {}
        snapshot = observe(
            self.api,
            "ns",
            "tiny",
            NodeIndex(),
            watches=self.watches,
            watched=watched,
            counted=lambda kind, source: self.sources.__setitem__(kind, source),
        )
        assert snapshot is not None
        return snapshot


def settled() -> Cluster:
    """A cache with a DaemonSet, a Service and a budget, all delivered by the watches, and one full
    pass that LISTed them."""
    cluster = Cluster()
    cluster.put("DaemonSet", "tiny-daemon", "daemon")
    cluster.put("Service", "tiny", "service")
    cluster.put("PodDisruptionBudget", "tiny-active", "disruption-budget")
    for kind, name in (("DaemonSet", "tiny-daemon"), ("Service", "tiny"), ("PodDisruptionBudget", "tiny-active")):
        cluster.deliver(kind, name)
    cluster.look(watched=False)
    return cluster


def test_a_settled_cache_is_read_from_the_watches_without_a_request() -> None:
    cluster = settled()
    snapshot = cluster.look()
    assert cluster.sources == {"pods": "watch", "daemonsets": "watch", "services": "watch", "budgets": "watch"}
    assert [ds["metadata"]["name"] for ds in snapshot.daemonsets] == ["tiny-daemon"]
    assert snapshot.service is not None and snapshot.service["metadata"]["name"] == "tiny"
    assert snapshot.budget is not None and snapshot.budget["metadata"]["name"] == "tiny-active"


def test_a_full_pass_lists_every_kind_however_fresh_the_watches() -> None:
    cluster = settled()
    cluster.look(watched=False)
    assert set(cluster.sources.values()) == {"list"}


def test_a_daemonset_a_pass_applied_is_read_from_the_watch_only_once_it_delivered_that_version() -> None:
    cluster = settled()
    snapshot = cluster.look()
    live = cluster.api.stored("DaemonSet", "tiny-daemon")
    applied = cluster.api.apply(f"{DAEMONSETS}/tiny-daemon", {**live, "spec": {"image": "new"}})
    snapshot.daemonset_applied(applied)

    cluster.watches.daemonsets.put(copy.deepcopy(live))  # an event from before the apply
    assert cluster.look().daemonsets[0]["spec"] == {"image": "new"}
    assert cluster.sources["daemonsets"] == "list"
    assert cluster.sources["services"] == "watch"

    cluster.deliver("DaemonSet", "tiny-daemon")
    assert cluster.look().daemonsets[0]["spec"] == {"image": "new"}
    assert cluster.sources["daemonsets"] == "watch"


def test_a_daemonset_a_pass_deleted_is_listed_until_the_watch_tells_of_its_deletion() -> None:
    cluster = settled()
    snapshot = cluster.look()
    cluster.api.delete(f"{DAEMONSETS}/tiny-daemon")
    snapshot.daemonset_deleted("tiny-daemon")

    assert cluster.look().daemonsets == []
    assert cluster.sources["daemonsets"] == "list"

    for _kind, gone in cluster.api.removed:
        cluster.watches.daemonsets.remove(gone)
    assert cluster.look().daemonsets == []
    assert cluster.sources["daemonsets"] == "watch"


def test_a_budget_a_pass_patched_is_listed_until_the_watch_delivers_the_patch() -> None:
    cluster = settled()
    snapshot = cluster.look()
    patched = cluster.api.patch(f"{BUDGETS}/tiny-active", {"metadata": {"annotations": {"recount": "1"}}})
    snapshot.budget_applied(patched)

    cluster.look()
    assert cluster.sources["budgets"] == "list"
    cluster.deliver("PodDisruptionBudget", "tiny-active")
    budget = cluster.look().budget
    assert cluster.sources["budgets"] == "watch"
    assert budget is not None and budget["metadata"]["annotations"] == {"recount": "1"}


def test_after_a_watch_listed_again_its_kind_is_listed_once_and_a_service_deleted_in_the_gap_is_gone() -> None:
    cluster = settled()
    cluster.api.remove("Service", "tiny")  # deleted while the watch was away: never reported
    cluster.watches.services.relisted()

    assert cluster.look().service is None
    assert cluster.sources["services"] == "list"
    assert cluster.sources["daemonsets"] == "watch"
    assert cluster.look().service is None
    assert cluster.sources["services"] == "watch"


def test_after_a_failed_pass_the_next_one_lists_every_kind() -> None:
    cluster = settled()
    cluster.watches.unchecked(("ns", "tiny"))
    cluster.look()
    assert set(cluster.sources.values()) == {"list"}
