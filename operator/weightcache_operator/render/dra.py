"""``gpuAccess: dra``: the daemon's GPUs come from a ResourceClaim that its node's engines share.

Why a ResourceClaimTemplate and not one ResourceClaim per node: a DaemonSet has one pod template
for every node, so its pods can only reference a *template*; the resourceclaim controller then
creates one claim per daemon pod and names it in ``pod.status.resourceClaimStatuses``. Engine
pods reference that generated claim by name (``resourceClaimName``), and pods sharing a claim get
the same allocated devices — exactly the GPUs that hold the weights, on the daemon's node.

A claim belongs to its daemon pod (the controller sets the owner reference): when the daemon pod
is replaced, its successor gets a new claim, possibly on other devices, and engines still bound to
the old claim are stale (``engine_claim_current`` says so; the operator replaces them).
"""

from __future__ import annotations

from typing import Any

from weightcache_operator.spec import Dra, WeightCache
from weightcache_operator.vocabulary import CLAIM_ANNOTATION, CacheRef

CLAIM_NAME = "gpus"
"""The claim's name inside the pods (``spec.resourceClaims[].name``, ``resources.claims[].name``)."""
DRA_API_VERSION = "resource.k8s.io/v1"


def uses_dra(cache: WeightCache) -> bool:
    return cache.spec.engine.gpu_access == "dra"


def claim_template_name(ref: CacheRef) -> str:
    return f"{ref.name}-gpus"


def claim_template(cache: WeightCache) -> dict[str, Any]:
    """The ResourceClaimTemplate each daemon pod's claim is made from: ranks-per-node devices of
    ``spec.engine.dra.deviceClassName``."""
    ref = CacheRef.of(cache)
    dra = cache.spec.engine.dra or Dra()
    request = {
        "name": CLAIM_NAME,
        "exactly": {
            "deviceClassName": dra.device_class_name,
            "allocationMode": "ExactCount",
            "count": cache.spec.parallelism.ranks_per_node,
        },
    }
    return {
        "apiVersion": DRA_API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(ref),
            "namespace": ref.namespace,
            "labels": ref.labels("daemon"),
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {"metadata": {"labels": ref.labels("daemon")}, "spec": {"devices": {"requests": [request]}}},
    }


def daemon_claim_fields(cache: WeightCache) -> list[dict[str, Any]]:
    """``spec.resourceClaims`` of the daemon pod template."""
    return [{"name": CLAIM_NAME, "resourceClaimTemplateName": claim_template_name(CacheRef.of(cache))}]


def engine_claim_fields(claim: str) -> list[dict[str, Any]]:
    """``spec.resourceClaims`` of an engine pod: the daemon pod's generated claim, by name."""
    return [{"name": CLAIM_NAME, "resourceClaimName": claim}]


def container_claims() -> list[dict[str, str]]:
    """``resources.claims`` of a container that uses the devices."""
    return [{"name": CLAIM_NAME}]


def daemon_claim(pod: dict[str, Any]) -> str | None:
    """The ResourceClaim generated for a daemon pod, once the controller has created it."""
    for entry in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("name") == CLAIM_NAME:
            claim = entry.get("resourceClaimName")
            return str(claim) if claim else None
    return None


def engine_claim_current(engine: dict[str, Any], daemon: dict[str, Any] | None) -> bool:
    """Whether an engine shares the devices of ``daemon`` (its node's current daemon pod). An
    engine without a claim annotation (``visibleDevices``) depends on no claim."""
    wanted = (engine["metadata"].get("annotations") or {}).get(CLAIM_ANNOTATION)
    if wanted is None:
        return True
    return daemon is not None and daemon_claim(daemon) == wanted
