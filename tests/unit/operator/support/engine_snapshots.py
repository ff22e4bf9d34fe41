"""One replica's cache (CACHE, WANT) and snapshots of its engine pods on node-1, beside a Ready
daemon of its generation and the Service on that generation: what ``engine_plan.plan_engines``
reads in one pass."""

from __future__ import annotations

from typing import Any

from builders import daemon, make, scheduled
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.engine_plan import desired
from weightcache_operator.render import ENGINE_HASH_LABEL, daemon_spec_hash, engine_pod, engine_service

CACHE = make(**{"engine.replicas": 1, "engine.standbysPerReplica": 1})
WANT = desired(CACHE)


def engine(
    name: str, role: str, *, version: str | None = None, ready: bool = True, deleting: bool = False, age_s: float = 100
) -> dict[str, Any]:
    """CACHE's engine pod of replica 0 in ``role`` on node-1, created ``age_s`` before NOW, of engine
    ``version`` (the rendered one unless said)."""
    return scheduled(
        engine_pod(CACHE, 0, role, ["node-1"]),
        node="node-1",
        name=name,
        namespace="ns",
        labels={ENGINE_HASH_LABEL: version} if version is not None else None,
        created=-age_s,
        deleted=0 if deleting else None,
        ready=ready,
    )


def snapshot(*engines: dict[str, Any]) -> Snapshot:
    ready = daemon("d1", node="node-1", spec_hash=daemon_spec_hash(CACHE), ready=True)
    body = {"metadata": {"name": CACHE.metadata["name"], "namespace": "ns"}, "status": {}}
    return Snapshot(
        body,
        CACHE,
        daemon_pods=[ready],
        engine_pods=list(engines),
        service=engine_service(CACHE, daemon_spec_hash(CACHE)),
    )
