"""The Service in front of a cache's engines: it selects active engines only, so standbys map the
weights and turn Ready without receiving traffic until the operator promotes one. With
``parallelism.nodes > 1`` only a group's leader (node rank 0) serves HTTP, so only leaders."""

from __future__ import annotations

from typing import Any

from ..spec import WeightCache
from .layout import CACHE_LABEL, COMPONENT_LABEL, NODE_RANK_LABEL, ROLE_LABEL, CacheRef


def engine_service(cache: WeightCache) -> dict[str, Any]:
    ref = CacheRef.of(cache)
    spec = cache.spec
    selector = {CACHE_LABEL: ref.name, COMPONENT_LABEL: "engine", ROLE_LABEL: "active"}
    if spec.parallelism.nodes > 1:
        selector[NODE_RANK_LABEL] = "0"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": spec.service.name or ref.name,
            "namespace": ref.namespace,
            "labels": ref.labels("service"),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "type": spec.service.type,
            "selector": selector,
            "ports": [{"name": "http", "port": spec.service.port, "targetPort": spec.engine.port, "protocol": "TCP"}],
        },
    }
