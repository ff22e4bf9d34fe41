"""The ``sglang`` load profile: each rank runs SGLang's own loader and post-processing through the
shared publisher (``engine_profiles``). Imports no SGLang until a rank runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from weightcache_contract.launch import SGLANG_PROFILE

from ..engine_profiles.profile import EngineLoadProfile
from ..profiles import register_profile

if TYPE_CHECKING:
    from ..engine_profiles.publisher import EngineRank


@register_profile(SGLANG_PROFILE)
class Sglang(EngineLoadProfile):
    def engine_rank(self) -> EngineRank:
        from .publisher import SglangRank

        return SglangRank()
