"""The InferencePool of ``spec.routing.inferencePool`` (Gateway API Inference Extension,
``inference.networking.k8s.io/v1``): the managed pool, and the check of a referenced one. An
endpoint picker filters pods on readiness, and a standby engine is Ready by design (it has mapped
the weights), so a pool must select what the Service selects — serving engines of the serving
generation — and nothing else. Pure: specs and objects in, objects and problems out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from weightcache_operator.render.service import serving_selector
from weightcache_operator.spec import POOL_API_VERSION, POOL_KIND, InferencePoolRouting, WeightCache
from weightcache_operator.vocabulary import (
    CACHE_LABEL,
    COMPONENT_LABEL,
    ENGINE_HASH_LABEL,
    GROUP_LABEL,
    MANAGED_BY,
    NODE_RANK_LABEL,
    REPLICA_LABEL,
    ROLE_LABEL,
    SERVED_MODEL_ANNOTATION,
    SPEC_HASH_LABEL,
    CacheRef,
    served_model_name,
)

CONDITION = "InferencePoolReady"
VARYING_LABELS = (SPEC_HASH_LABEL, ENGINE_HASH_LABEL, REPLICA_LABEL, GROUP_LABEL)
"""Labels the operator sets per engine, rollout or generation: a referenced pool that selects on
one of them loses serving engines at the next rollout or generation change, or never had them all.
A managed pool follows the serving generation's hash, as the Service does."""


def routing(cache: WeightCache) -> InferencePoolRouting | None:
    return cache.spec.routing.inference_pool if cache.spec.routing is not None else None


def pool_name(cache: WeightCache) -> str | None:
    """The pool spec.routing names (a managed one defaults to the cache's name); None without one."""
    wanted = routing(cache)
    if wanted is None:
        return None
    return wanted.name or CacheRef.of(cache).name


def managed_pool(cache: WeightCache, daemon_hash: str | None = None) -> dict[str, Any]:
    """The managed pool: the Service's selector for generation ``daemon_hash`` (the one the live
    Service selects), the engine port, the endpoint picker of the spec; owned by the cache, so the
    garbage collector deletes it with the cache."""
    wanted = routing(cache)
    assert wanted is not None and wanted.mode == "Managed"
    ref = CacheRef.of(cache)
    spec: dict[str, Any] = {
        "selector": {"matchLabels": serving_selector(cache, daemon_hash)},
        "targetPorts": [{"number": cache.spec.engine.port}],
    }
    picker = wanted.endpoint_picker_ref
    if picker is not None:
        spec["endpointPickerRef"] = {
            "kind": "Service",
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": {
            "name": pool_name(cache),
            "namespace": ref.namespace,
            "labels": ref.labels("inference-pool"),
            # What a route's model match (an InferenceObjective, a gateway's body-based routing)
            # names: the model the pool's engines answer to.
            "annotations": {SERVED_MODEL_ANNOTATION: served_model_name(cache)},
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class Problem:
    reason: str
    message: str


def serving_labels(cache: WeightCache) -> dict[str, str]:
    """The labels every serving engine of the cache carries, whatever its replica, rollout or
    generation: the engine template's own, then the operator's (which win, as on the pods)."""
    template = (cache.spec.engine.template.metadata or {}).get("labels") or {}
    ref = CacheRef.of(cache)
    labels = {**template, **ref.labels("engine"), ROLE_LABEL: "active"}
    if cache.spec.parallelism.nodes > 1:
        labels[NODE_RANK_LABEL] = "0"
    return labels


def reference_problems(cache: WeightCache, pool: dict[str, Any]) -> list[Problem]:
    """What keeps the referenced ``pool`` from selecting exactly the cache's serving engines on
    their serving port; empty when nothing does. Each message names the label or port and the fix."""
    spec = pool.get("spec") or {}
    selector: dict[str, str] = dict((spec.get("selector") or {}).get("matchLabels") or {})
    name = CacheRef.of(cache).name
    stable = serving_labels(cache)
    found: list[Problem] = []
    if selector.get(CACHE_LABEL) is None:
        found.append(
            Problem(
                "SelectorTooWide",
                f"the selector has no {CACHE_LABEL}: it includes other caches' engines and any other pod it matches;"
                f" add {CACHE_LABEL}: {name}",
            )
        )
    if selector.get(ROLE_LABEL) is None:
        found.append(
            Problem(
                "SelectorTooWide",
                f"the selector has no {ROLE_LABEL}: it includes standby engines, which are Ready but must receive"
                f" no request; add {ROLE_LABEL}: active",
            )
        )
    if cache.spec.parallelism.nodes > 1 and selector.get(NODE_RANK_LABEL) is None:
        found.append(
            Problem(
                "SelectorTooWide",
                f"the selector has no {NODE_RANK_LABEL}: it includes engine group followers, which serve no HTTP;"
                f" add {NODE_RANK_LABEL}: '0'",
            )
        )
    for key, value in sorted(selector.items()):
        if key in VARYING_LABELS:
            found.append(
                Problem(
                    "SelectorMismatch",
                    f"the selector has {key}, which the operator changes per engine, rollout or generation:"
                    f" the pool would lose serving engines; remove {key}",
                )
            )
        elif key not in stable:
            found.append(
                Problem(
                    "SelectorMismatch",
                    f"the selector has {key}: {value}, a label serving engines do not carry: it selects none of them;"
                    " remove it or set it in spec.engine.template.metadata.labels",
                )
            )
        elif stable[key] != value:
            found.append(
                Problem(
                    "SelectorMismatch",
                    f"the selector has {key}: {value}, but serving engines carry {key}: {stable[key]};"
                    f" set {key}: {stable[key]}",
                )
            )
    ports = [p.get("number") for p in spec.get("targetPorts") or []]
    if ports != [cache.spec.engine.port]:
        found.append(
            Problem(
                "TargetPortMismatch",
                f"targetPorts {ports} are not the engine port {cache.spec.engine.port} (spec.engine.port);"
                f" set targetPorts to [{{number: {cache.spec.engine.port}}}]",
            )
        )
    return found


def is_managed_pool(cache: WeightCache, pool: dict[str, Any]) -> bool:
    """Whether ``pool`` is one this cache's operator made (owned by the cache, with its labels)."""
    meta = pool.get("metadata") or {}
    ref = CacheRef.of(cache)
    owned = any(o.get("uid") == ref.uid for o in meta.get("ownerReferences") or [])
    labels = meta.get("labels") or {}
    return (
        owned
        and labels.get(COMPONENT_LABEL) == "inference-pool"
        and all(labels.get(k) == v for k, v in MANAGED_BY.items())
    )
