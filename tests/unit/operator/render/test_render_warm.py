"""The warm sidecar of serving engine pods: it warms the engine through the engine's own readiness
path and port with the request a client would send, its command parses with ``weightcache warm``'s
own parser, its port avoids every port the pod declares, and pods that serve no HTTP get none."""

from __future__ import annotations

import json
from typing import Any

from builders import cache_of, make
from example_caches import body
from weightcache.cli import build_parser
from weightcache_contract.launch import WarmArgs
from weightcache_operator.render import engine_pod
from weightcache_operator.render.engine import Member
from weightcache_operator.render.warm import WARM_CONTAINER
from weightcache_operator.vocabulary import CLI


def warm_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in pod["spec"]["containers"] if c["name"] == WARM_CONTAINER), None)


def parsed(container: dict[str, Any]) -> WarmArgs:
    command = container["command"]
    assert command[: len(CLI)] == CLI and command[len(CLI)] == "warm"
    return WarmArgs.from_namespace(build_parser().parse_args(command[len(CLI) :]))


def test_a_reference_engine_pod_is_warmed_on_its_readiness_path_with_a_completion_of_one_token() -> None:
    cache = make()
    pod = engine_pod(cache, 0, "standby")
    warm = warm_of(pod)
    assert warm is not None and pod["spec"]["containers"][0]["name"] != WARM_CONTAINER
    args = parsed(warm)
    port = cache.spec.engine.port
    assert args.engine_url == f"http://$(POD_IP):{port}" and args.health_path == "/ready"
    assert args.host == "$(POD_IP)"
    body = json.loads(args.request)
    assert body["max_tokens"] == 1 and body["model"] == cache.metadata["name"]
    assert warm["readinessProbe"]["httpGet"] == {"path": "/ready", "port": args.port}
    assert args.port != port
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in warm["env"]


def test_the_keep_warm_interval_is_the_specs() -> None:
    assert parsed(warm_of(engine_pod(make(**{"engine.failover.keepWarmSeconds": 0}), 0, "active"))).every == 0
    assert parsed(warm_of(engine_pod(make(), 0, "active"))).every == 30


def test_a_vllm_engine_pod_is_warmed_on_vllms_health_with_its_served_model_name() -> None:
    obj = body("weightcache-vllm-cpu.yaml")
    obj["spec"]["engine"]["servedModelName"] = "tiny"
    cache = cache_of(obj)
    args = parsed(warm_of(engine_pod(cache, 0, "standby")))
    assert args.health_path == "/health"
    assert args.request_path == "/v1/completions" and json.loads(args.request)["model"] == "tiny"


def test_the_sidecars_port_avoids_every_port_the_pod_declares() -> None:
    taken = [{"name": f"p{p}", "containerPort": p} for p in (8009, 8010)]
    cache = make(**{"engine.template.spec.containers": [{"name": "engine", "image": "e:1", "ports": taken}]})
    warm = warm_of(engine_pod(cache, 0, "active"))
    assert parsed(warm).port == 8011 and warm["ports"] == [{"name": "warm", "containerPort": 8011}]


def test_an_engine_without_an_http_readiness_probe_gets_no_sidecar() -> None:
    probe = {"exec": {"command": ["true"]}}
    containers = [{"name": "engine", "image": "e:1", "readinessProbe": probe}]
    assert warm_of(engine_pod(make(**{"engine.template.spec.containers": containers}), 0, "active")) is None


def test_a_follower_of_a_multi_node_engine_gets_no_sidecar_its_leader_does() -> None:
    cache = make(**{"parallelism.tensor": 2, "parallelism.nodes": 2})
    leader = engine_pod(cache, 0, "active", member=Member(group="g", node_rank=0))
    follower = engine_pod(cache, 0, "active", member=Member(group="g", node_rank=1, leader_ip="198.18.1.2"))
    assert warm_of(leader) is not None and warm_of(follower) is None


def test_the_sidecar_runs_restricted_with_a_read_only_root() -> None:
    warm = warm_of(engine_pod(make(), 0, "active"))
    context = warm["securityContext"]
    assert context["readOnlyRootFilesystem"] is True and context["allowPrivilegeEscalation"] is False
    assert context["runAsNonRoot"] is True
