"""The ``SyncRouting`` action (actions.py) for ``spec.routing.inferencePool``: apply the managed
InferencePool on the generation the Service selects, or check the referenced one, and say how it went in
``status.inferencePool`` and the InferencePoolReady condition. Caches without routing send no
request here (unless a managed pool is left to delete). A missing CRD or missing rights is a
condition naming what to install or enable, never a failed pass: the engines serve through the
Service regardless."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from weightcache_operator.act.applying import apply_if_different
from weightcache_operator.kubeapi import ApiError, KubeApi
from weightcache_operator.objects import Object
from weightcache_operator.plan.status import status_condition
from weightcache_operator.plan.status_reports import RoutingReport
from weightcache_operator.render.inference_pool import (
    CONDITION,
    Problem,
    is_managed_pool,
    managed_pool,
    pool_name,
    reference_problems,
)
from weightcache_operator.render.inference_pool import routing as pool_routing
from weightcache_operator.spec import POOL_API_VERSION, POOL_PLURAL, Condition, InferencePoolStatus, WeightCache

log = logging.getLogger("weightcache_operator.act.routing")

CRD_NAME = f"{POOL_PLURAL}.{POOL_API_VERSION.split('/')[0]}"
TESTED_RELEASE = "v1.6.0"
"""The extension's release whose InferencePool CRD the e2e tests install (tests/e2e/upstream/)."""
RIGHTS = "list, create, patch and delete"


def pools_path(namespace: str) -> str:
    return f"/apis/{POOL_API_VERSION}/namespaces/{namespace}/{POOL_PLURAL}"


def _refusal(error: ApiError, doing: str) -> Problem:
    """What the user must install or enable, for an answer that is theirs to fix."""
    if error.status == 404:
        return Problem(
            "CRDNotInstalled",
            f"the {CRD_NAME} CRD is not installed, so there is no InferencePool to {doing}: install the Gateway API"
            f" Inference Extension's CRDs (v1; this operator is tested with release {TESTED_RELEASE})",
        )
    if error.status == 403:
        return Problem(
            "Forbidden",
            f"the operator may not {doing} InferencePools: install the chart with"
            f" --set routing.inferencePool.enabled=true (or grant {RIGHTS} on {CRD_NAME}), and install the CRD if it"
            f" is not; the API server said: {error}",
        )
    return Problem("ApiError", f"could not {doing} the InferencePool: {error}")


def _find(api: KubeApi, namespace: str, name: str) -> Object | None:
    """The pool ``name``, by a LIST: one verb for both modes, and a missing CRD (404) told apart
    from a missing pool (no item)."""
    answer = api.request("GET", pools_path(namespace), params={"fieldSelector": f"metadata.name={name}"}, verb="LIST")
    items: list[Object] = answer.get("items") or []
    return items[0] if items else None


def sync_pool(
    api: KubeApi,
    cache: WeightCache,
    serve_hash: str | None,
    now: datetime,
    previous_conditions: Sequence[Condition] | None,
) -> RoutingReport:
    """``status.inferencePool`` and the InferencePoolReady condition for the pass; neither
    without routing. ``serve_hash``: the daemon spec hash the live Service selects."""
    namespace = cache.metadata.get("namespace", "default")
    _delete_stale(api, cache, namespace)
    wanted = pool_routing(cache)
    name = pool_name(cache)
    if wanted is None or name is None:
        return RoutingReport()
    problems: list[Problem]
    try:
        live = _find(api, namespace, name)
    except ApiError as error:
        problems = [_refusal(error, "read")]
    else:
        if wanted.mode == "Managed":
            problems = _apply(api, cache, namespace, name, live, serve_hash)
        elif live is None:
            problems = [
                Problem(
                    "PoolNotFound",
                    f"InferencePool {name} does not exist in namespace {namespace}: create it (docs/operator.md has"
                    " one that selects the serving engines) or correct spec.routing.inferencePool.name",
                )
            ]
        else:
            problems = reference_problems(cache, live)
    if problems:
        reason, message = problems[0].reason, "; ".join(p.message for p in problems)
    elif wanted.mode == "Managed":
        reason, message = "PoolApplied", f"InferencePool {name} selects the engines the Service selects"
    else:
        reason = "SelectsServingEngines"
        message = (
            f"InferencePool {name} selects active engines of this cache only, on port {cache.spec.engine.port};"
            " it cannot follow the generation the Service selects during a generation change (mode Managed does)"
        )
    found = status_condition(
        CONDITION, not problems, reason, message, now, previous_conditions, cache.metadata.get("generation")
    )
    return RoutingReport(InferencePoolStatus(name=name, mode=wanted.mode), found)


def _apply(
    api: KubeApi, cache: WeightCache, namespace: str, name: str, live: Object | None, serve_hash: str | None
) -> list[Problem]:
    if live is not None and not is_managed_pool(cache, live):
        return [
            Problem(
                "PoolNotOwned",
                f"InferencePool {name} exists and is not this cache's: the operator leaves it alone; name another"
                " pool in spec.routing.inferencePool.name, or check yours with mode Reference",
            )
        ]
    try:
        apply_if_different(api, f"{pools_path(namespace)}/{name}", managed_pool(cache, serve_hash), live)
    except ApiError as error:
        return [_refusal(error, "apply")]
    return []


def _delete_stale(api: KubeApi, cache: WeightCache, namespace: str) -> None:
    """Deletes the managed pool the last status names when the spec no longer wants it (routing
    removed, mode Reference, another name): the garbage collector would keep it until the cache
    goes, with a selector nobody updates. Only a pool this cache owns; a referenced one never."""
    before = cache.status.inference_pool if cache.status is not None else None
    if before is None or before.mode != "Managed":
        return
    wanted = pool_routing(cache)
    if wanted is not None and wanted.mode == "Managed" and pool_name(cache) == before.name:
        return
    try:
        live = _find(api, namespace, before.name)
        if live is not None and is_managed_pool(cache, live):
            api.delete(f"{pools_path(namespace)}/{before.name}")
            log.info("deleted inference pool", extra={"pool": before.name, "reason": "no longer in the spec"})
    except ApiError as error:  # the CRD or the rights went with the routing: nothing to delete then
        log.warning("stale inference pool left", extra={"pool": before.name, "error": str(error)})
