"""The reference profile: daemons run weightcache's own loader (our sharding tables and FP8
post-processing) and engines are whatever the template runs over the weightcache client, the
reference engine (``weightcache engine``) or transformers. What every spec selects unless
another profile's block is set."""

from __future__ import annotations

from typing import Any

from weightcache_contract.launch import REFERENCE_PROFILE

from weightcache_operator.profiles.base import EngineProfile
from weightcache_operator.spec import WeightCache

READY_PATH = "/ready"
"""The reference engine's readiness: 200 once every rank (remote ones included) loaded and warmed up."""


class Reference(EngineProfile):
    name = "reference"
    load_profile = REFERENCE_PROFILE

    def daemon_args(self, cache: WeightCache) -> dict[str, Any]:
        """What the daemon's own loader shards and quantizes by (all of it enters the fingerprint)."""
        model = cache.spec.model
        block = model.quantization.weight_block_size
        return {
            "dtype": model.dtype,
            "quantization": model.quantization.method,
            "weight_block_size": (block[0], block[1]) if model.quantization.method == "fp8" else None,
            "revision": model.revision,
            "ep_size": cache.spec.parallelism.expert,
        }

    def plans(self, cache: WeightCache) -> bool:
        return True

    def engine_probes(self, cache: WeightCache) -> dict[str, dict[str, Any]]:
        # Out of the Service within two seconds of a failing answer.
        port = cache.spec.engine.port
        return {
            "readinessProbe": {"httpGet": {"path": READY_PATH, "port": port}, "periodSeconds": 1, "failureThreshold": 2}
        }
