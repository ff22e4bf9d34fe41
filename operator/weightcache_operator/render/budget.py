"""The PodDisruptionBudget over a cache's serving engines: what makes ``kubectl drain`` (and any
other user of the Eviction API) wait for the operator before it takes an active engine away.

It selects exactly what the Service sends traffic to (``serving_engines``: active, of the
generation served; every pod of an engine group) and asks for all of them to stay available, so
the Eviction API refuses (429) to evict a Ready active. A drain cordons the node first; the
operator reads that as the active's failure (``NodeCordoned``), promotes a Ready standby on a
schedulable node and demotes the old active, which then no longer matches this budget and is
evicted on the drain's next retry. Standbys are not covered: evicting one costs no request.

``minAvailable`` is a count, not ``maxUnavailable: 0``: the disruption controller turns
``maxUnavailable`` (and percentages) into a count through the pods' controller's scale
subresource, which a WeightCache does not have, and then fails the budget's sync (it still
refuses every eviction, but says ``SyncFailed``). An integer needs no controller. It is the
number of pods the Service selects when every replica is whole, so with every active Ready the
budget allows no disruption, and its message (``needs 1 healthy pods and has 1``) is true.

``unhealthyPodEvictionPolicy: AlwaysAllow``: an active that is not Ready serves nothing, so
keeping it would only block the drain; the operator fails it over like any other failure.
"""

from __future__ import annotations

from typing import Any

from weightcache_operator.render.service import serving_engines
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CacheRef

BUDGET_API = "policy/v1"


def budget_name(ref: CacheRef) -> str:
    return f"{ref.name}-active"


def engine_budget(cache: WeightCache, daemon_hash: str | None = None) -> dict[str, Any]:
    """``daemon_hash``: the generation the Service serves (as ``engine_service``)."""
    ref = CacheRef.of(cache)
    return {
        "apiVersion": BUDGET_API,
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": budget_name(ref),
            "namespace": ref.namespace,
            "labels": ref.labels("disruption-budget"),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": serving_engines(cache, daemon_hash)},
            "minAvailable": cache.spec.engine.replicas * cache.spec.parallelism.nodes,
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
