"""spec.routing.inferencePool without a cluster: the managed pool selects exactly what the Service
selects and is valid under the upstream InferencePool CRD vendored in tests/e2e/upstream/; a
referenced pool's selector and ports are checked against the labels serving engines carry, each
problem named with its fix; the spec refuses contradictory settings with the field's name; API
refusals become what to install or enable. The real API server's side is
tests/e2e/test_inference_pool_e2e.py."""

from __future__ import annotations

from typing import Any, get_args

import jsonschema
import pytest
import yaml
from builders import BASE, make
from repo_root import ROOT
from weightcache_operator.act.routing import _refusal
from weightcache_operator.kubeapi import ApiError
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import engine_pod, engine_service
from weightcache_operator.render.engine import Member
from weightcache_operator.render.inference_pool import managed_pool, pool_name, reference_problems
from weightcache_operator.spec import FailureMode

UPSTREAM = ROOT / "tests" / "e2e" / "upstream" / "inference.networking.k8s.io_inferencepools.yaml"
MANAGED = {"inferencePool": {"mode": "Managed", "endpointPickerRef": {"name": "epp", "port": 9002}}}


def upstream_schema() -> dict[str, Any]:
    crd = yaml.safe_load(UPSTREAM.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    assert version["served"] and version["storage"]
    return dict(version["schema"]["openAPIV3Schema"])


def matches(selector: dict[str, str], pod: dict[str, Any]) -> bool:
    labels = pod["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def test_a_managed_pool_selects_exactly_the_services_pods_on_the_engine_port() -> None:
    cache = make(routing=MANAGED, **{"engine.port": 8001})
    pool = managed_pool(cache)
    assert pool["metadata"]["name"] == pool_name(cache) == "tiny"
    assert pool["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert pool["spec"]["selector"]["matchLabels"] == engine_service(cache)["spec"]["selector"]
    assert pool["spec"]["targetPorts"] == [{"number": 8001}]
    # The model its engines answer to, as on the Service: a route can match on it.
    assert pool["metadata"]["annotations"] == engine_service(cache)["metadata"]["annotations"]
    assert pool["metadata"]["annotations"] == {"weightcache.io/served-model-name": "tiny"}
    assert pool["spec"]["endpointPickerRef"] == {
        "kind": "Service",
        "name": "epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    selector = pool["spec"]["selector"]["matchLabels"]
    assert matches(selector, engine_pod(cache, 0, "active"))
    assert not matches(selector, engine_pod(cache, 0, "standby"))
    # Generation change: the pool follows the hash the live Service selects, as the Service does.
    assert (
        managed_pool(cache, "0ld")["spec"]["selector"]["matchLabels"]
        == engine_service(cache, "0ld")["spec"]["selector"]
    )


def test_a_managed_pool_of_multi_node_engines_selects_group_leaders_only() -> None:
    cache = make(routing=MANAGED, **{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4, "parallelism.nodes": 2})
    selector = managed_pool(cache)["spec"]["selector"]["matchLabels"]
    leader = engine_pod(cache, 0, "active", member=Member("g1", 0))
    follower = engine_pod(cache, 0, "active", member=Member("g1", 1, leader_ip="198.18.0.5"))
    assert matches(selector, leader) and not matches(selector, follower)


def test_the_managed_pool_is_valid_under_the_upstream_crd_schema() -> None:
    schema = upstream_schema()
    for routing in (MANAGED, {"inferencePool": {"mode": "Managed", "name": "chat"}}):
        jsonschema.validate(managed_pool(make(routing=routing)), schema)
    broken = managed_pool(make(routing=MANAGED))
    broken["spec"]["endpointPickerRef"]["failureMode"] = "Open"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_failure_mode_is_spelled_as_upstream_spells_it() -> None:
    picker = upstream_schema()["properties"]["spec"]["properties"]["endpointPickerRef"]["properties"]
    assert sorted(get_args(FailureMode)) == sorted(picker["failureMode"]["enum"])
    assert picker["failureMode"]["default"] == "FailClose"


def reference(selector: dict[str, str], ports: list[int] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "mine"},
        "spec": {"selector": {"matchLabels": selector}, "targetPorts": [{"number": p} for p in ports or [8000]]},
    }


REFERENCED = {"inferencePool": {"mode": "Reference", "name": "mine"}}
GOOD = {"weightcache.io/cache": "tiny", "weightcache.io/role": "active"}


def test_a_referenced_pool_selecting_active_engines_of_the_cache_passes() -> None:
    cache = make(routing=REFERENCED)
    assert reference_problems(cache, reference(GOOD)) == []
    # Labels every serving engine carries may narrow it further: the template's, the component.
    assert reference_problems(cache, reference({**GOOD, "app": "chat", "weightcache.io/component": "engine"})) == []


@pytest.mark.parametrize(
    ("selector", "ports", "reason", "says"),
    [
        ({"weightcache.io/cache": "tiny"}, None, "SelectorTooWide", "includes standby engines"),
        ({"weightcache.io/role": "active"}, None, "SelectorTooWide", "add weightcache.io/cache: tiny"),
        ({"app": "chat"}, None, "SelectorTooWide", "other caches' engines"),
        ({**GOOD, "weightcache.io/role": "standby"}, None, "SelectorMismatch", "set weightcache.io/role: active"),
        ({**GOOD, "weightcache.io/daemon-spec-hash": "abc"}, None, "SelectorMismatch", "per engine, rollout or"),
        ({**GOOD, "weightcache.io/replica": "0"}, None, "SelectorMismatch", "remove weightcache.io/replica"),
        ({**GOOD, "tier": "gold"}, None, "SelectorMismatch", "a label serving engines do not carry"),
        ({**GOOD, "app": "search"}, None, "SelectorMismatch", "serving engines carry app: chat"),
        (GOOD, [8000, 9090], "TargetPortMismatch", "not the engine port 8000 (spec.engine.port)"),
        (GOOD, [8080], "TargetPortMismatch", "set targetPorts to [{number: 8000}]"),
    ],
)
def test_a_referenced_pool_that_reaches_other_pods_or_misses_serving_ones_is_explained(
    selector: dict[str, str], ports: list[int] | None, reason: str, says: str
) -> None:
    problems = reference_problems(make(routing=REFERENCED), reference(selector, ports))
    assert problems and problems[0].reason == reason, problems
    assert any(says in p.message for p in problems), problems


def test_a_referenced_pool_of_multi_node_engines_must_leave_followers_out() -> None:
    cache = make(routing=REFERENCED, **{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4, "parallelism.nodes": 2})
    problems = reference_problems(cache, reference(GOOD))
    assert [p.reason for p in problems] == ["SelectorTooWide"] and "followers" in problems[0].message
    assert reference_problems(cache, reference({**GOOD, "weightcache.io/node-rank": "0"})) == []


@pytest.mark.parametrize(
    ("routing", "says"),
    [
        ({"inferencePool": {"mode": "Reference"}}, "mode Reference needs inferencePool.name"),
        (
            {"inferencePool": {"mode": "Reference", "name": "x", "endpointPickerRef": {"name": "e", "port": 1}}},
            "endpointPickerRef is rendered into a managed pool only",
        ),
        ({"inferencePool": {"mode": "Managed", "endpointPickerRef": {"name": "e"}}}, "port"),
        ({"inferencePool": {"mode": "Owned"}}, "Managed"),
        (
            {
                "inferencePool": {
                    "mode": "Managed",
                    "endpointPickerRef": {"name": "e", "port": 1, "failureMode": "Open"},
                }
            },
            "FailClose",
        ),
    ],
)
def test_contradictory_routing_is_refused_naming_the_field(routing: dict[str, Any], says: str) -> None:
    body = {**BASE, "spec": {**BASE["spec"], "routing": routing}}
    cache, problems = parse(body)
    assert cache is None and any(says in p for p in problems), problems


def test_no_routing_renders_nothing() -> None:
    assert pool_name(make()) is None


def test_api_refusals_say_what_to_install_or_enable() -> None:
    missing = _refusal(ApiError(404, {"message": "the server could not find the requested resource"}), "read")
    assert missing.reason == "CRDNotInstalled" and "inferencepools.inference.networking.k8s.io" in missing.message
    # The release it names is the one whose CRD the tests run against.
    bundle = yaml.safe_load(UPSTREAM.read_text())["metadata"]["annotations"][
        "inference.networking.k8s.io/bundle-version"
    ]
    assert f"tested with release {bundle}" in missing.message
    forbidden = _refusal(ApiError(403, {"message": "forbidden"}), "apply")
    assert forbidden.reason == "Forbidden" and "--set routing.inferencePool.enabled=true" in forbidden.message
