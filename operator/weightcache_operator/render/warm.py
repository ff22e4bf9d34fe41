"""The warm sidecar of a serving engine pod (``weightcache warm``, daemon_image/weightcache/warm.py).

Its readiness is the pod's with the engine's own: the pod turns Ready only once the engine has
answered a real request through its API since it last came up, so the Service and a failover
only ever pick engines that have served, and the sidecar's keep-warm request
(``spec.engine.failover.keepWarmSeconds``) keeps an idle standby so. The engine's readiness probe
still judges the engine (and is what the operator polls for hangs, responsiveness.py); the
sidecar says nothing about an engine that is up except whether it has served.
"""

from __future__ import annotations

import json
from typing import Any

from weightcache_contract.launch import WARM_PORT, WarmArgs

from weightcache_operator import profiles
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CLI

WARM_CONTAINER = "weightcache-warm"
WARM_READY_PATH = "/ready"
RESOURCES = {"requests": {"cpu": "10m", "memory": "48Mi"}, "limits": {"memory": "128Mi"}}
"""A standard-library HTTP loop: 35 MiB resident, CPU only for a probe a second and the
keep-warm request (the engine's cost of one token is the engine's)."""


def warm_container(cache: WeightCache, main: dict[str, Any], containers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The sidecar for an engine pod whose serving container is ``main`` (its probes set), or None
    when ``main`` has no HTTP readiness probe on a numbered port to tell when the engine is up."""
    get = (main.get("readinessProbe") or {}).get("httpGet") or {}
    port = _port_number(get.get("port"), main)
    if port is None:
        return None
    path, body = profiles.profile_of(cache).warm_request(cache)
    listen = _free_port(containers)
    args = WarmArgs(
        engine_url=f"http://$(POD_IP):{port}",
        health_path=get.get("path") or "/",
        request_path=path,
        request=json.dumps(body, sort_keys=True),
        host="$(POD_IP)",
        port=listen,
        every=float(cache.spec.engine.failover.keep_warm_seconds),
    )
    container: dict[str, Any] = {
        "name": WARM_CONTAINER,
        "image": main.get("image", ""),
        "command": [*CLI, "warm", *args.to_argv()],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": "warm", "containerPort": listen}],
        # One second to Ready once warm. Unready only after three failed probes of 2 s: a sidecar
        # slow to answer on a loaded node must not fail over a healthy active (the engine's own
        # probe judges the engine; this one only gates on having served).
        "readinessProbe": {
            "httpGet": {"path": WARM_READY_PATH, "port": listen},
            "periodSeconds": 1,
            "timeoutSeconds": 2,
            "failureThreshold": 3,
        },
        "resources": RESOURCES,
    }
    if "imagePullPolicy" in main:
        container["imagePullPolicy"] = main["imagePullPolicy"]
    return container


def _port_number(port: Any, main: dict[str, Any]) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, str):
        if port.isdigit():
            return int(port)
        return next((p["containerPort"] for p in main.get("ports") or [] if p.get("name") == port), None)
    return None


def _free_port(containers: list[dict[str, Any]]) -> int:
    """``--port``'s default, or the first port above it no container of the pod declares."""
    taken = {p.get("containerPort") for c in containers for p in c.get("ports") or []}
    for c in containers:
        get = (c.get("readinessProbe") or {}).get("httpGet") or {}
        taken.add(get.get("port"))
    port = int(WARM_PORT.default)
    while port in taken:
        port += 1
    return port
