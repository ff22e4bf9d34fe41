"""The pod index (watch_index.py): passes read a cache's pods from the watch only when it holds
every write of the cache's earlier passes and a LIST has checked it since the watch listed;
otherwise they LIST. Each test is one way a stale view could make a pass act twice or not at all."""

from __future__ import annotations

from functools import partial
from typing import Any

from builders import engine
from weightcache_operator.observe.watch_index import WatchIndex

KEY = ("ns", "tiny")


watched = partial(engine, namespace="ns", cache="tiny")
"""An engine pod of the cache KEY names, as its watch event shows it."""


def names(view: list[dict[str, Any]] | None) -> list[str] | None:
    return None if view is None else [p["metadata"]["name"] for p in view]


def checked(index: WatchIndex, *pods: dict[str, Any], at: int = 100) -> WatchIndex:
    for p in pods:
        index.put(p)
    index.listed(KEY, list(pods), at)
    return index


def test_the_watch_is_read_only_once_a_list_has_checked_the_cache() -> None:
    index = WatchIndex()
    index.put(watched("engine-a", resource_version=10))
    assert index.view(KEY) is None, "before any LIST: deletions from before the watch started are unknown"
    index.listed(KEY, [watched("engine-a", resource_version=10)], 12)
    assert names(index.view(KEY)) == ["engine-a"]
    assert index.view(("ns", "other")) is None


def test_a_created_pod_must_come_back_through_the_watch_before_passes_read_it() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    created = watched("engine-b", resource_version=20)
    index.wrote(KEY, created)
    assert index.view(KEY) is None, "without engine-b the next pass would create it again"
    index.put(
        watched("engine-c", resource_version=21)
    )  # another pod's event does not vouch for engine-b (kopf's workers reorder)
    assert index.view(KEY) is None
    index.put(created)
    assert names(index.view(KEY)) == ["engine-a", "engine-b", "engine-c"]


def test_a_patched_pod_is_trusted_at_the_patched_version_or_newer() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.wrote(KEY, watched("engine-a", resource_version=30))  # relabelled active
    index.put(watched("engine-a", resource_version=25))  # an older change still on its way
    assert index.view(KEY) is None
    index.put(
        watched("engine-a", resource_version=31)
    )  # the kubelet's status after the relabel: newer, so it includes it
    assert names(index.view(KEY)) == ["engine-a"]


def test_a_write_the_watch_delivered_before_the_pass_recorded_it_needs_no_wait() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.put(watched("engine-a", resource_version=30))
    index.wrote(KEY, watched("engine-a", resource_version=30))
    assert names(index.view(KEY)) == ["engine-a"]


def test_a_deleted_pod_must_show_its_deletion_or_be_gone() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10), watched("engine-b", resource_version=11))
    index.deleting(KEY, watched("engine-a", resource_version=10))
    assert index.view(KEY) is None, "a view still serving engine-a would count it as a live active"
    index.put(watched("engine-a", resource_version=40, deleted=0))
    assert names(index.view(KEY)) == ["engine-a", "engine-b"]
    index.deleting(KEY, watched("engine-b", resource_version=11))
    index.remove(watched("engine-b", resource_version=41))
    assert names(index.view(KEY)) == ["engine-a"]


def test_a_deletion_the_watch_handled_before_the_pass_recorded_it_counts() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.remove(watched("engine-a", resource_version=40))  # handled by kopf's worker for engine-a first
    index.deleting(KEY, watched("engine-a", resource_version=10))
    assert names(index.view(KEY)) == []
    index.wrote(KEY, watched("engine-a", resource_version=39))  # a patch answered just before the deletion
    assert names(index.view(KEY)) == []


def test_a_name_used_again_is_a_new_pod() -> None:
    # A multi-node group's pods have fixed names: the old pod's copy says nothing of the new one.
    index = checked(WatchIndex(), watched("tiny-0-g1-1", resource_version=10, uid="old"))
    index.remove(watched("tiny-0-g1-1", resource_version=12, uid="old"))
    index.wrote(KEY, watched("tiny-0-g1-1", resource_version=20, uid="new"))
    assert index.view(KEY) is None, "the tombstone is the old pod's, not the new one's"
    index.put(watched("tiny-0-g1-1", resource_version=20, uid="new"))
    assert names(index.view(KEY)) == ["tiny-0-g1-1"]
    index.remove(watched("tiny-0-g1-1", resource_version=12, uid="old"))  # a late deletion of the old pod
    assert names(index.view(KEY)) == ["tiny-0-g1-1"]


def test_a_list_removes_pods_the_watch_never_said_were_deleted_but_not_newer_ones() -> None:
    index = checked(WatchIndex(), watched("ghost", resource_version=10), watched("engine-a", resource_version=11))
    index.put(watched("engine-new", resource_version=60))  # created after the LIST below was answered
    index.listed(KEY, [watched("engine-a", resource_version=11)], 50)
    assert names(index.view(KEY)) == ["engine-a", "engine-new"]


def test_a_listing_of_the_watch_makes_every_cache_list_again() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.relisted()
    assert index.view(KEY) is None
    index.listed(KEY, [watched("engine-a", resource_version=10)], 70)
    assert names(index.view(KEY)) == ["engine-a"]


def test_a_resource_version_that_is_no_number_is_never_taken_as_new_enough() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    odd = watched("engine-a", resource_version=0)
    odd["metadata"]["resourceVersion"] = "opaque"
    index.wrote(KEY, odd)
    index.put(odd)
    assert index.view(KEY) is None, "the pass LISTs instead"


def test_pods_of_other_caches_and_unlabelled_pods_stay_apart() -> None:
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.put(engine("engine-x", namespace="ns", cache="other", resource_version=11))
    stray = watched("stray", resource_version=12)
    del stray["metadata"]["labels"]
    index.put(stray)
    assert names(index.view(KEY)) == ["engine-a"]


def test_after_a_failed_pass_the_next_one_lists() -> None:
    # A create whose answer was lost to a timeout may have happened: only a LIST can tell.
    index = checked(WatchIndex(), watched("engine-a", resource_version=10))
    index.unchecked(KEY)
    assert index.view(KEY) is None
    index.listed(KEY, [watched("engine-a", resource_version=10), watched("engine-b", resource_version=12)], 12)
    assert index.view(KEY) is None, "the LIST saw engine-b: the watch must show it before it is read again"
    index.put(watched("engine-b", resource_version=12))
    assert names(index.view(KEY)) == ["engine-a", "engine-b"]
