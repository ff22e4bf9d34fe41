"""applying: when the operator's one apply step writes and when it leaves the live object alone
(tests/e2e/test_apply_if_different_e2e.py runs it against the API server's defaulting)."""

from __future__ import annotations

from typing import Any

from weightcache_operator.act.applying import APPLIED_HASH_ANNOTATION, contains, stamped, up_to_date

WANTED: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": "q", "labels": {"a": "1", "b": "2"}},
    "spec": {"selector": {"a": "1"}, "ports": [{"name": "http", "port": 80}]},
}


def as_stored(wanted: dict[str, Any]) -> dict[str, Any]:
    """What the API server returns after applying ``wanted``: its own fields and defaults added."""
    body = stamped(wanted)
    return {
        **body,
        "metadata": {**body["metadata"], "uid": "u", "resourceVersion": "7", "managedFields": [{}]},
        "spec": {**body["spec"], "clusterIP": "10.96.0.9", "ports": [{**body["spec"]["ports"][0], "protocol": "TCP"}]},
        "status": {"loadBalancer": {}},
    }


def test_an_applied_object_with_the_servers_defaults_added_is_up_to_date() -> None:
    assert up_to_date(as_stored(WANTED), WANTED)


def test_an_item_of_a_list_is_up_to_date_though_lists_leave_out_its_api_version_and_kind() -> None:
    # Passes observe DaemonSets by a LIST: comparing apiVersion and kind applied every one on every resync.
    listed = {k: v for k, v in as_stored(WANTED).items() if k not in ("apiVersion", "kind")}
    assert up_to_date(listed, WANTED)


def test_nothing_live_is_never_up_to_date() -> None:
    assert not up_to_date(None, WANTED)


def test_a_field_removed_from_what_is_wanted_is_a_difference_though_the_live_object_contains_the_rest() -> None:
    fewer = {**WANTED, "metadata": {**WANTED["metadata"], "labels": {"a": "1"}}}
    live = as_stored(WANTED)
    assert contains(live, fewer)  # a subset check alone would skip the apply
    assert not up_to_date(live, fewer)


def test_a_hand_edit_of_a_wanted_field_is_a_difference_though_the_recorded_hash_matches() -> None:
    live = as_stored(WANTED)
    live["spec"]["selector"] = {"a": "edited"}
    assert (
        live["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
        == stamped(WANTED)["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
    )
    assert not up_to_date(live, WANTED)


def test_a_list_element_the_live_object_has_beyond_the_wanted_ones_is_a_difference() -> None:
    live = as_stored(WANTED)
    live["spec"]["ports"].append({"name": "extra", "port": 81, "protocol": "TCP"})
    assert not up_to_date(live, WANTED)


def test_a_changed_wanted_field_changes_the_recorded_hash() -> None:
    changed = {**WANTED, "spec": {**WANTED["spec"], "ports": [{"name": "http", "port": 81}]}}
    assert stamped(changed)["metadata"]["annotations"] != stamped(WANTED)["metadata"]["annotations"]
