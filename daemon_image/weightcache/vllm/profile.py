"""The ``vllm`` load profile: each rank runs vLLM's own loader and post-processing through the
shared publisher (``engine_profiles``). Imports no vLLM until a rank runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from weightcache_contract.launch import VLLM_PROFILE

from ..engine_profiles.profile import EngineLoadProfile
from ..profiles import register_profile

if TYPE_CHECKING:
    from ..engine_profiles.publisher import EngineRank


@register_profile(VLLM_PROFILE)
class Vllm(EngineLoadProfile):
    def engine_rank(self) -> EngineRank:
        from .publisher import VllmRank

        return VllmRank()

    def compile_env(self, data: Path, environ: Mapping[str, str]) -> dict[str, str]:
        """vLLM's compile cache root, and ``AOT_DEFAULTS``. vLLM moves Inductor's and Triton's
        caches under ``VLLM_CACHE_ROOT`` only where its own compile cache is used; without the AOT
        function, vLLM's CPU build compiles through Inductor's FX graph and AOTAutograd caches in
        ``TORCHINDUCTOR_CACHE_DIR`` (seen: nothing but ``modelinfos/`` under ``VLLM_CACHE_ROOT``
        otherwise), which artifacts-run points under ``data`` for every engine."""
        return {**{k: v for k, v in AOT_DEFAULTS.items() if k not in environ}, "VLLM_CACHE_ROOT": str(data)}


AOT_DEFAULTS = {"VLLM_USE_AOT_COMPILE": "0"}
"""Set unless the engine's environment sets them. vLLM 0.32's ahead-of-time compiled function (its
default with torch ≥ 2.10) does not load back on this CPU build with torch 2.13: every later engine
logs ``Compiling model again due to a load failure …: 'function' object has no attribute
'finalize_loading'`` and compiles again, with or without ``VLLM_USE_MEGA_AOT_ARTIFACT``. Without
it vLLM traces with Dynamo (seconds) and loads Inductor's compiled graphs from its cache by keys
relative to the cache directory, so a copied entry works from any staging directory."""
