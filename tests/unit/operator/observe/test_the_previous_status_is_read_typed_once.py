"""A pass reads the status the cache holds once, typed (Snapshot.previous): the parsed cache's own
``status``, or for an object whose spec does not parse its ``status`` alone, keeping the
conditions that parse when the rest does not."""

from __future__ import annotations

from builders import make
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.observe.validation import parse
from weightcache_operator.spec import WeightCacheStatus

DEGRADED = {"type": "Degraded", "status": "True", "reason": "InvalidSpec", "lastTransitionTime": "2026-11-29T09:00:00Z"}


def test_a_parsed_cache_s_status_is_the_previous_status() -> None:
    body = make().model_dump(by_alias=True, mode="json", exclude_none=True)
    body["status"] = {"phase": "Ready", "rollout": {"phase": "Complete", "engineTemplateHash": "h"}}
    cache, problems = parse(body)
    assert cache is not None and not problems

    previous = Snapshot(body, cache).previous

    assert previous is cache.status and previous.rollout is not None and previous.rollout.phase == "Complete"
    assert previous.wire() == body["status"], "read back as the API holds it"


def test_an_invalid_spec_s_status_is_read_alone_and_what_does_not_parse_of_it_is_left_out() -> None:
    body = {"metadata": {"name": "tiny", "namespace": "ns"}, "spec": {"model": 1}, "status": {"conditions": [DEGRADED]}}
    assert Snapshot(body, None).previous == WeightCacheStatus.model_validate(body["status"])
    body["status"] = {"phase": "Sideways", "conditions": [DEGRADED, {"type": "X", "status": "Maybe"}]}

    previous = Snapshot(body, None).previous

    assert previous.wire() == {"conditions": [DEGRADED]}
    assert Snapshot({"metadata": {}}, None).previous == WeightCacheStatus()
