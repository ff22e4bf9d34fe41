"""Pure renderers: a parsed WeightCache in, Kubernetes manifests (plain dicts) out.

Nothing here talks to the API server, reads the clock or the environment, so every object the
operator applies can be unit-tested from a spec alone and two operator replicas render the same
bytes for the same spec (server-side apply then has nothing to fight about).
"""

from weightcache_operator.render.daemon import daemon_daemonset
from weightcache_operator.render.engine import engine_pod, engine_template_hash
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.render.service import engine_service
from weightcache_operator.vocabulary import (
    CACHE_LABEL,
    COMPONENT_LABEL,
    ENGINE_HASH_LABEL,
    READY_GATE,
    REPLICA_LABEL,
    ROLE_LABEL,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_LABEL,
    CacheRef,
    local_ranks,
)

__all__ = [
    "CACHE_LABEL",
    "COMPONENT_LABEL",
    "ENGINE_HASH_LABEL",
    "READY_GATE",
    "REPLICA_LABEL",
    "ROLE_LABEL",
    "SPEC_HASH_ANNOTATION",
    "SPEC_HASH_LABEL",
    "CacheRef",
    "daemon_daemonset",
    "daemon_spec_hash",
    "engine_pod",
    "engine_template_hash",
    "engine_service",
    "local_ranks",
]
