"""The Service in front of a cache's engines: it selects active engines only, so standbys map the
weights and turn Ready without receiving traffic until the operator promotes one, and of one
daemon generation only, so during a generation change clients never reach two fingerprints. With
``parallelism.nodes > 1`` only a group's leader (node rank 0) serves HTTP, so only leaders."""

from __future__ import annotations

from typing import Any

from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import (
    CACHE_LABEL,
    COMPONENT_LABEL,
    NODE_RANK_LABEL,
    ROLE_LABEL,
    SERVED_MODEL_ANNOTATION,
    SPEC_HASH_LABEL,
    CacheRef,
    served_model_name,
)


def serving_engines(cache: WeightCache, daemon_hash: str | None = None) -> dict[str, str]:
    """The labels of the engine pods that serve: active, of generation ``daemon_hash`` (every pod
    of an engine group, followers included: the leader cannot serve without them)."""
    return {
        CACHE_LABEL: CacheRef.of(cache).name,
        COMPONENT_LABEL: "engine",
        ROLE_LABEL: "active",
        SPEC_HASH_LABEL: daemon_hash or daemon_spec_hash(cache),
    }


def serving_selector(cache: WeightCache, daemon_hash: str | None = None) -> dict[str, str]:
    """The Service's selector: the serving engines of generation ``daemon_hash`` that answer HTTP
    (with ``parallelism.nodes > 1`` a group's leader only). A managed InferencePool selects the same."""
    selector = serving_engines(cache, daemon_hash)
    if cache.spec.parallelism.nodes > 1:
        selector[NODE_RANK_LABEL] = "0"
    return selector


def engine_service(cache: WeightCache, daemon_hash: str | None = None) -> dict[str, Any]:
    """``daemon_hash``: the daemon spec hash to serve; the current one unless a generation change
    is still moving engines over (rollout.serve_hash decides)."""
    ref = CacheRef.of(cache)
    spec = cache.spec
    selector = serving_selector(cache, daemon_hash)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.service.name or ref.name,
            "namespace": ref.namespace,
            "labels": ref.labels("service"),
            "annotations": {SERVED_MODEL_ANNOTATION: served_model_name(cache)},
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "type": spec.service.type,
            "selector": selector,
            "ports": [{"name": "http", "port": spec.service.port, "targetPort": spec.engine.port, "protocol": "TCP"}],
        },
    }
