"""An engine version (the engine hash a rollout compares) follows what the pod runs, not its role or node;
the name engines serve under is the cache's unless the spec names another, and a name clients could not
send is refused."""

from __future__ import annotations

import copy

import pytest
from builders import BASE, NOW, make
from rendered import container, env_of
from weightcache_operator.observe.validation import parse
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import (
    daemon_spec_hash,
    engine_pod,
    engine_template_hash,
)


def test_engine_hash_follows_the_rendered_pod_not_its_role_or_node() -> None:
    """A rollout's version: the template, port, env and the daemon generation change it; the
    role, replica and nodes an engine is pinned to do not (they differ between pods of a version)."""
    base = make()
    assert engine_template_hash(base) == engine_template_hash(make())
    same = {
        engine_pod(base, r, role, nodes)["metadata"]["labels"]["weightcache.io/engine-hash"]
        for r, role, nodes in ((0, "active", None), (3, "standby", ["node-1"]))
    }
    assert same == {engine_template_hash(base)}
    tpl = copy.deepcopy(BASE["spec"]["engine"]["template"])
    tpl["spec"]["containers"][0]["env"] = [{"name": "VERSION", "value": "2"}]
    changed = [make(**{"engine.template": tpl}), make(**{"engine.port": 8123}), make(**{"model.revision": "r2"})]
    assert len({engine_template_hash(c) for c in changed} | {engine_template_hash(base)}) == 4
    assert daemon_spec_hash(changed[0]) == daemon_spec_hash(base), "a template change leaves the daemons alone"
    assert daemon_spec_hash(changed[2]) != daemon_spec_hash(base)
    # The rollout settings decide how a version rolls, not what it is.
    assert engine_template_hash(make(**{"engine.rollout": {"readyDeadlineSeconds": 5}})) == engine_template_hash(base)
    # Nor do the failover settings: changing the daemon outage grace must not roll every engine.
    assert engine_template_hash(make(**{"engine.failover": {"daemonOutageGraceSeconds": 2}})) == engine_template_hash(
        base
    )


def test_engines_serve_under_the_caches_name_unless_the_spec_names_another() -> None:
    """Clients ask for the name ``kubectl get wc`` shows; a different served name is a new engine
    version (a rollout), never a new daemon generation."""
    base = make()
    assert env_of(container(engine_pod(base, 0, "active"), "engine"))["WEIGHTCACHE_ENGINE_SERVED_MODEL_NAME"] == "tiny"
    named = make(**{"engine.servedModelName": "Qwen/Qwen3-0.6B"})
    env = env_of(container(engine_pod(named, 0, "active"), "engine"))
    assert env["WEIGHTCACHE_ENGINE_SERVED_MODEL_NAME"] == "Qwen/Qwen3-0.6B"
    assert engine_template_hash(named) != engine_template_hash(base)
    assert daemon_spec_hash(named) == daemon_spec_hash(base)
    # The default follows the cache's name: another cache of the same spec serves another name.
    other = copy.deepcopy(BASE)
    other["metadata"]["name"] = "chat"
    renamed, problems = parse(other)
    assert renamed is not None and not problems
    assert engine_template_hash(renamed) != engine_template_hash(base)
    status = aggregate(named, Observed([], [], 1), NOW).wire()
    assert status["servedModelName"] == "Qwen/Qwen3-0.6B"
    assert aggregate(base, Observed([], [], 1), NOW).wire()["servedModelName"] == "tiny"


@pytest.mark.parametrize("name", ["", "two words", "x" * 257])
def test_a_served_model_name_clients_could_not_send_is_refused(name: str) -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["engine"]["servedModelName"] = name
    cache, problems = parse(body)
    assert cache is None and any("servedModelName" in p for p in problems), problems
