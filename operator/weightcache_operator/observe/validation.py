"""Cross-field rules the CRD schema cannot express (or that depend on what this operator and the
data plane support). Each message names the field and says what to change, because it ends up
verbatim in the ``Degraded``/``InvalidSpec`` condition a user reads with ``kubectl describe``.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from weightcache_contract.backends import BACKENDS, GPU_BACKENDS

from weightcache_operator.profiles import conflict, profile_of
from weightcache_operator.spec import STOP_GRACE_S, Condition, WeightCache, WeightCacheStatus

GPU_RESOURCE = "nvidia.com/gpu"
VERIFIED_FP8_BLOCK = [128, 128]


def parse(body: dict[str, Any]) -> tuple[WeightCache | None, list[str]]:
    """Parses an object read from the API server; returns the model or the problems found.
    Never raises on bad user input: an invalid object must become a condition, not a crash."""
    try:
        cache = WeightCache.model_validate(body)
    except ValidationError as error:
        return None, [_pydantic_message(e) for e in error.errors()]
    return cache, problems(cache)


def previous_status(body: dict[str, Any], cache: WeightCache | None) -> WeightCacheStatus:
    """The status the object holds, typed: ``cache.status`` when the object parsed, else its
    ``status`` parsed alone. A status that does not parse (the API server prunes what the CRD's
    schema does not know, so only a hand-written one) keeps the conditions that do: an invalid
    spec's Degraded condition still keeps its ``lastTransitionTime``."""
    if cache is not None:
        return cache.status or WeightCacheStatus()
    raw = body.get("status") or {}
    try:
        return WeightCacheStatus.model_validate(raw)
    except ValidationError:
        pass
    conditions = []
    listed = raw.get("conditions") if isinstance(raw, dict) else None
    for item in listed if isinstance(listed, list) else []:
        try:
            conditions.append(Condition.model_validate(item))
        except ValidationError:
            continue
    return WeightCacheStatus(conditions=conditions)


def problems(cache: WeightCache) -> list[str]:
    """Every cross-field mistake in ``cache.spec``; empty when the operator can run it."""
    spec = cache.spec
    found: list[str] = []
    if spec.daemon.backend not in BACKENDS:
        found.append(f"spec.daemon.backend {spec.daemon.backend!r} is unknown; use one of {sorted(BACKENDS)}")
    per_node = spec.parallelism.ranks_per_node
    if spec.engine.gpu_access == "dra":
        if any(GPU_RESOURCE in ((spec.daemon.resources or {}).get(k) or {}) for k in ("limits", "requests")):
            found.append(
                f"spec.daemon.resources asks for {GPU_RESOURCE}, but with spec.engine.gpuAccess dra the daemon's GPUs "
                f"come from a ResourceClaim ({per_node} devices of spec.engine.dra.deviceClassName); "
                f"remove {GPU_RESOURCE} from spec.daemon.resources"
            )
    elif spec.daemon.backend in GPU_BACKENDS:
        for kind in ("limits", "requests"):
            asked = ((spec.daemon.resources or {}).get(kind) or {}).get(GPU_RESOURCE)
            if asked is not None and _count(asked) < per_node:
                found.append(
                    f"spec.daemon.resources.{kind} asks for {asked} {GPU_RESOURCE} per node but each node runs "
                    f"{per_node} ranks (tensor × pipeline / nodes); GPUs per node must be ≥ ranks per node"
                )
    elif spec.daemon.resources and any(
        GPU_RESOURCE in (spec.daemon.resources.get(k) or {}) for k in ("limits", "requests")
    ):
        found.append(f"spec.daemon.backend cpu-shm uses no GPUs; remove {GPU_RESOURCE} from spec.daemon.resources")
    quant = spec.model.quantization
    if quant.method == "fp8" and list(quant.weight_block_size) != VERIFIED_FP8_BLOCK:
        found.append(
            f"spec.model.quantization.weightBlockSize {list(quant.weight_block_size)} is not supported; "
            "block-wise FP8 is verified for [128, 128] only"
        )
    for i, container in enumerate(spec.engine.template.spec.containers):
        if not container.get("name"):
            found.append(f"spec.engine.template.spec.containers[{i}] needs a name")
    if spec.engine.template.spec.model_dump().get("hostNetwork"):
        found.append(
            "spec.engine.template.spec.hostNetwork must not be set: active and standby engines share a node and port"
        )
    found += _grace_problems(cache)
    clash = conflict(cache)
    found += [clash] if clash is not None else profile_of(cache).problems(cache)
    return found


def _grace_problems(cache: WeightCache) -> list[str]:
    """The API server refuses a pod whose preStop sleep does not fit in its grace period; say so
    on the cache instead of failing every engine creation."""
    engine = cache.spec.engine
    grace = engine.template.spec.model_dump().get("terminationGracePeriodSeconds")
    sleep = engine.pre_stop_sleep_seconds
    own_hook = (engine.template.spec.containers[0].get("lifecycle") or {}).get("preStop")
    if own_hook is not None or sleep == 0 or not isinstance(grace, int) or grace > sleep:
        return []
    return [
        f"spec.engine.template.spec.terminationGracePeriodSeconds ({grace}) must exceed"
        f" spec.engine.preStopSleepSeconds ({sleep}): a deleted engine sleeps that long before it is told to"
        f" stop; raise the grace period to {sleep + STOP_GRACE_S} (the sleep, then the engine's drain),"
        " lower preStopSleepSeconds, or leave terminationGracePeriodSeconds unset"
    ]


def _count(quantity: Any) -> int:
    try:
        return int(str(quantity))
    except ValueError:
        return 0


def _pydantic_message(error: Any) -> str:
    location = ".".join(str(part) for part in error.get("loc", ()))
    return f"{location}: {error.get('msg')}" if location else str(error.get("msg"))
