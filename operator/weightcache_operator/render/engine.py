"""Engine pods: the user's template plus what lets the engine map the node's cache.

Engines are Pods the operator owns directly (not a Deployment) because each carries a role
(active or standby) that the operator flips; the Service selects ``role=active``.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Literal

from ..spec import WeightCache
from .daemon import GPU_BACKENDS
from .layout import (
    MODEL_MOUNT,
    READY_GATE,
    REPLICA_LABEL,
    ROLE_LABEL,
    SOCKET_MOUNT,
    SPEC_HASH_ANNOTATION,
    ENGINE_HASH_LABEL,
    SPEC_HASH_LABEL,
    CacheRef,
    daemon_spec_hash,
    model_volume,
    placement_fields,
    socket_volume,
)

Role = Literal["active", "standby"]


def engine_pod(cache: WeightCache, replica: int, role: Role, nodes: list[str] | None = None) -> dict[str, Any]:
    """One engine pod for ``replica`` in ``role``; named by the API server (generateName), so a
    replacement can be created while its predecessor is still terminating.

    ``nodes``: the nodes whose daemons are ready now; the pod is pinned to them so it never
    starts (and, with fallback disk, silently loads from disk) where no daemon holds the weights.

    Labelled with ``engine_template_hash`` (its version, for rollouts) and the daemon spec hash
    (its generation, which the Service selects)."""
    pod = _render(cache, replica, role, nodes)
    pod["metadata"]["labels"][ENGINE_HASH_LABEL] = engine_template_hash(cache)
    return pod


def engine_template_hash(cache: WeightCache) -> str:
    """A digest of the engine pod as rendered without what differs between pods of one version
    (replica, role, the nodes it is pinned to): a change to it is an engine rollout. It covers
    the daemon spec hash too (the pod carries it), so a generation change is also a new version."""
    pod = _render(cache, 0, "active", None)
    for label in (REPLICA_LABEL, ROLE_LABEL):
        del pod["metadata"]["labels"][label]
    canonical = json.dumps(pod, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _render(cache: WeightCache, replica: int, role: Role, nodes: list[str] | None) -> dict[str, Any]:
    ref = CacheRef.of(cache)
    spec = cache.spec
    template = spec.engine.template
    meta = copy.deepcopy(template.metadata or {})
    pod_spec = copy.deepcopy(template.spec.model_dump(by_alias=True, exclude_none=True))

    labels = {
        **(meta.get("labels") or {}),
        **ref.labels("engine"),
        REPLICA_LABEL: str(replica),
        ROLE_LABEL: role,
        SPEC_HASH_LABEL: daemon_spec_hash(cache),
    }
    annotations = {**(meta.get("annotations") or {}), SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}

    model_vol, model_mount = model_volume(cache)
    sock_vol, sock_mount = socket_volume(ref)
    env = _client_env(cache, ref)
    for container in pod_spec["containers"]:
        names = {e.get("name") for e in container.get("env", [])}
        container["env"] = [*(copy.deepcopy(e) for e in env if e["name"] not in names), *container.get("env", [])]
        mounts = [m for m in container.get("volumeMounts", []) if m.get("name") not in ("model", sock_mount["name"])]
        container["volumeMounts"] = [*mounts, dict(model_mount), dict(sock_mount)]
    main = pod_spec["containers"][0]
    main.setdefault("ports", [{"name": "http", "containerPort": spec.engine.port}])
    main.setdefault(
        "readinessProbe",
        {"httpGet": {"path": "/ready", "port": spec.engine.port}, "periodSeconds": 1, "failureThreshold": 2},
    )

    volumes = [v for v in pod_spec.get("volumes", []) if v.get("name") not in ("model", sock_vol["name"])]
    pod_spec["volumes"] = [*volumes, model_vol, sock_vol]
    gates = [g for g in pod_spec.get("readinessGates", []) if g.get("conditionType") != READY_GATE]
    pod_spec["readinessGates"] = [*gates, {"conditionType": READY_GATE}]
    for key, value in placement_fields(cache).items():
        pod_spec.setdefault(key, copy.deepcopy(value))
    if nodes is not None:
        _pin_to_nodes(pod_spec, nodes)
    pod_spec.setdefault("restartPolicy", "Always")

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": f"{ref.name}-{replica}-",
            "namespace": ref.namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": pod_spec,
    }


def _client_env(cache: WeightCache, ref: CacheRef) -> list[dict[str, Any]]:
    """What the weightcache client (and the reference engine's flags) read. A variable the
    template sets itself wins, so users can override any of it."""
    spec = cache.spec
    model = spec.model
    values = {
        "WEIGHTCACHE_SOCKET_DIR": SOCKET_MOUNT,
        "WEIGHTCACHE_NAME": ref.name,
        "WEIGHTCACHE_TP_SIZE": str(spec.parallelism.tensor),
        "WEIGHTCACHE_PP_SIZE": str(spec.parallelism.pipeline),
        "WEIGHTCACHE_MODEL": MODEL_MOUNT,
        "WEIGHTCACHE_ENGINE_MODEL": MODEL_MOUNT,
        "WEIGHTCACHE_ENGINE_TP_SIZE": str(spec.parallelism.tensor),
        "WEIGHTCACHE_ENGINE_DTYPE": model.dtype,
        "WEIGHTCACHE_ENGINE_QUANTIZATION": model.quantization.method,
        "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE": "client",
        "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_FALLBACK": spec.engine.weight_fallback,
        "WEIGHTCACHE_ENGINE_BACKEND": spec.daemon.backend,
        "WEIGHTCACHE_ENGINE_PORT": str(spec.engine.port),
        # Engines of one node share the host's network in some runtimes: bind the pod's own IP.
        "WEIGHTCACHE_ENGINE_HOST": "$(POD_IP)",
    }
    if model.revision:
        values["WEIGHTCACHE_ENGINE_REVISION"] = model.revision
    if model.quantization.method == "fp8":
        values["WEIGHTCACHE_ENGINE_WEIGHT_BLOCK_SIZE"] = ",".join(map(str, model.quantization.weight_block_size))
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    env += [{"name": k, "value": v} for k, v in values.items()]
    if spec.daemon.backend in GPU_BACKENDS and spec.engine.gpu_access == "visibleDevices":
        # Engines request no GPUs; they see all of the node's devices and find the daemon's by UUID
        # (the fetch reply names it), whatever ordinal numbering their runtime gives them.
        env.append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
    return env


def _pin_to_nodes(pod_spec: dict[str, Any], nodes: list[str]) -> None:
    """ANDs ``hostname in nodes`` into every required node-affinity term (terms are ORed, the
    expressions of one term ANDed), keeping whatever affinity the template or placement set."""
    pin = {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(nodes)}
    required = (
        pod_spec.setdefault("affinity", {})
        .setdefault("nodeAffinity", {})
        .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    )
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(pin, values=list(pin["values"])))
    required["nodeSelectorTerms"] = terms
