"""An engine pod: its labels, readiness gate, socket and model mounts and the environment that makes it map
from its node's daemon, the template's own environment winning; the Service selecting the active engines of
one daemon generation."""

from __future__ import annotations

import copy

from builders import BASE, make
from rendered import container, env_of
from weightcache_operator.render import (
    READY_GATE,
    daemon_spec_hash,
    engine_pod,
    engine_service,
    engine_template_hash,
)


def test_engine_pod_gets_socket_env_gate_and_labels() -> None:
    pod = engine_pod(make(), replica=0, role="standby")
    meta = pod["metadata"]
    assert meta["generateName"] == "tiny-0-"
    assert meta["labels"] == {
        "app": "chat",
        "weightcache.io/cache": "tiny",
        "weightcache.io/component": "engine",
        "app.kubernetes.io/managed-by": "weightcache-operator",
        "weightcache.io/replica": "0",
        "weightcache.io/role": "standby",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(make()),
        "weightcache.io/engine-hash": engine_template_hash(make()),
    }
    assert meta["ownerReferences"][0]["kind"] == "WeightCache"
    assert pod["spec"]["readinessGates"] == [{"conditionType": READY_GATE}]
    engine = container(pod, "engine")
    env = env_of(engine)
    assert env["WEIGHTCACHE_ENGINE_SOCKET_DIR"] == "/run/weightcache" and env["WEIGHTCACHE_ENGINE_NAME"] == "tiny"
    assert env["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE"] == "client"
    assert env["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_FALLBACK"] == "disk"
    assert env["WEIGHTCACHE_ENGINE_TP_SIZE"] == "2" and env["WEIGHTCACHE_ENGINE_REVISION"] == "r1"
    assert env["WEIGHTCACHE_ENGINE_HOST"] == "$(POD_IP)" and env["WEIGHTCACHE_ENGINE_THREADS"] == "1"
    names = [e["name"] for e in engine["env"]]
    assert names.index("POD_IP") < names.index("WEIGHTCACHE_ENGINE_HOST"), "$(POD_IP) expands only if defined first"
    assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 8000}
    mounts = {m["name"]: m for m in engine["volumeMounts"]}
    assert mounts["weightcache-sockets"]["mountPath"] == "/run/weightcache" and mounts["model"]["readOnly"]
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}


def test_template_env_wins_and_gpu_access() -> None:
    tpl = copy.deepcopy(BASE["spec"]["engine"]["template"])
    tpl["spec"]["containers"][0]["env"] = [{"name": "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE", "value": "off"}]
    cache = make(**{"engine.template": tpl, "daemon.backend": "cuda-vmm", "engine.weightFallback": "error"})
    engine = container(engine_pod(cache, 2, "active"), "engine")
    env = [e for e in engine["env"] if e["name"] == "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE"]
    assert env == [{"name": "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE", "value": "off"}]
    assert env_of(engine)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(engine)["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_FALLBACK"] == "error"
    assert "resources" not in engine, "visibleDevices: engines request no GPUs"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container(engine_pod(make(), 0, "active"), "engine"))


def test_service_selects_active_engines() -> None:
    svc = engine_service(make(**{"service": {"name": "chat", "port": 80, "type": "ClusterIP"}, "engine.port": 8001}))
    assert svc["metadata"]["name"] == "chat"
    assert svc["metadata"]["annotations"] == {"weightcache.io/served-model-name": "tiny"}
    assert svc["spec"]["selector"] == {
        "weightcache.io/cache": "tiny",
        "weightcache.io/component": "engine",
        "weightcache.io/role": "active",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(make()),
    }
    assert svc["spec"]["ports"][0]["port"] == 80 and svc["spec"]["ports"][0]["targetPort"] == 8001
    # During a generation change the operator keeps the old generation selected until it switches.
    assert engine_service(make(), "0ld")["spec"]["selector"]["weightcache.io/daemon-spec-hash"] == "0ld"
