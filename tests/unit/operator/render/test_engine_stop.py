"""How a deleted engine stops: it keeps serving through a preStop sleep while the Service's
proxies catch up, then drains on SIGTERM within a grace period that fits both."""

from __future__ import annotations

import copy
from typing import Any

from builders import BASE, cache_of, changed, make
from example_caches import body
from weightcache_operator.observe.validation import parse
from weightcache_operator.render import engine_pod, engine_template_hash
from weightcache_operator.render.engine import Member
from weightcache_operator.spec import PRE_STOP_SLEEP_DEFAULT_S, STOP_GRACE_S


def rendered(**changes: Any) -> dict[str, Any]:
    return engine_pod(make(**changes), 0, "active", ["node-1"])["spec"]


def with_template(**pod_fields: Any) -> dict[str, Any]:
    template = copy.deepcopy(BASE["spec"]["engine"]["template"])
    template["spec"].update(pod_fields)
    return template


def test_the_engine_container_sleeps_before_its_sigterm_and_the_grace_period_covers_the_drain() -> None:
    spec = rendered()
    assert spec["containers"][0]["lifecycle"] == {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_DEFAULT_S}}}
    assert spec["terminationGracePeriodSeconds"] == PRE_STOP_SLEEP_DEFAULT_S + STOP_GRACE_S


def test_a_sidecar_is_left_alone_and_a_template_hook_and_grace_period_win() -> None:
    sidecar = {"name": "proxy", "image": "envoy", "command": ["envoy"]}
    own_hook = {"preStop": {"exec": {"command": ["drain-me"]}}, "postStart": {"exec": {"command": ["hi"]}}}
    main = {**BASE["spec"]["engine"]["template"]["spec"]["containers"][0], "lifecycle": own_hook}
    spec = rendered(**{"engine.template": with_template(containers=[main, sidecar], terminationGracePeriodSeconds=90)})
    assert spec["containers"][0]["lifecycle"] == own_hook
    assert "lifecycle" not in spec["containers"][1]
    assert spec["terminationGracePeriodSeconds"] == 90
    # A postStart of the template's own keeps its place next to the rendered preStop.
    main["lifecycle"] = {"postStart": own_hook["postStart"]}
    spec = rendered(**{"engine.template": with_template(containers=[main])})
    assert spec["containers"][0]["lifecycle"] == {
        "postStart": own_hook["postStart"],
        "preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_DEFAULT_S}},
    }


def test_zero_renders_no_hook_and_the_grace_period_is_the_drain_alone() -> None:
    spec = rendered(**{"engine.preStopSleepSeconds": 0})
    assert "lifecycle" not in spec["containers"][0]
    assert spec["terminationGracePeriodSeconds"] == STOP_GRACE_S


def test_every_member_of_an_engine_group_sleeps_so_followers_stay_while_the_leader_serves() -> None:
    cache = make(**{"parallelism.nodes": 2, "engine.preStopSleepSeconds": 8})
    leader = engine_pod(cache, 0, "active", ["node-1"], member=Member("g", 0))
    follower = engine_pod(cache, 0, "active", ["node-2"], member=Member("g", 1, "198.18.1.7"))
    for pod in (leader, follower):
        assert pod["spec"]["containers"][0]["lifecycle"]["preStop"] == {"sleep": {"seconds": 8}}
        assert pod["spec"]["terminationGracePeriodSeconds"] == 8 + STOP_GRACE_S


def test_the_default_sleep_keeps_the_engine_version_and_another_sleep_rolls_the_engines() -> None:
    # An operator upgrade that brings the field must not roll every engine of every cache.
    unset = make()
    explicit = make(**{"engine.preStopSleepSeconds": PRE_STOP_SLEEP_DEFAULT_S})
    assert engine_template_hash(unset) == engine_template_hash(explicit)
    longer = make(**{"engine.preStopSleepSeconds": PRE_STOP_SLEEP_DEFAULT_S + 10})
    assert engine_template_hash(longer) != engine_template_hash(unset), "new pods need the new sleep"


def test_a_grace_period_the_sleep_does_not_fit_in_is_refused_naming_both_fields_and_the_fix() -> None:
    body_ = copy.deepcopy(BASE)
    body_["spec"]["engine"]["preStopSleepSeconds"] = 20
    body_["spec"]["engine"]["template"] = with_template(terminationGracePeriodSeconds=20)
    _, problems = parse(body_)
    assert problems == [
        "spec.engine.template.spec.terminationGracePeriodSeconds (20) must exceed spec.engine.preStopSleepSeconds"
        f" (20): a deleted engine sleeps that long before it is told to stop; raise the grace period to {20 + STOP_GRACE_S}"
        " (the sleep, then the engine's drain), lower preStopSleepSeconds, or leave terminationGracePeriodSeconds unset"
    ]
    # The template's own hook replaces the sleep, and with it the constraint.
    main = {**body_["spec"]["engine"]["template"]["spec"]["containers"][0]}
    main["lifecycle"] = {"preStop": {"exec": {"command": ["drain-me"]}}}
    body_["spec"]["engine"]["template"]["spec"]["containers"] = [main]
    assert parse(body_)[1] == []


def test_vllm_engines_drain_on_sigterm_unless_engine_args_say_otherwise() -> None:
    command = engine_pod(cache_of(body()), 0, "active", ["node-a"])["spec"]["containers"][0]["command"]
    at = command.index("--shutdown-timeout")
    assert command[at + 1] == "30"
    mine = cache_of(changed(body(), **{"engine.vllm.engineArgs": ["--shutdown-timeout", "120"]}))
    command = engine_pod(mine, 0, "active", ["node-a"])["spec"]["containers"][0]["command"]
    # vLLM's parser keeps the last value: the user's comes after the rendered one.
    assert [command[i + 1] for i, t in enumerate(command) if t == "--shutdown-timeout"] == ["30", "120"]
