"""Engine profiles: the one place the operator tells engines apart (``base.EngineProfile`` says
what a profile decides). ``profile_of`` picks a cache's profile: the one whose block the spec sets,
else the reference profile; a spec that selects two is refused by validation (``conflict``).

A new engine is one module here with an ``EngineProfile`` subclass, added to ``PROFILES`` below
(tests register theirs with ``register``), plus its load profile on the data plane
(docs/architecture.md, "Adding an engine profile").
"""

from __future__ import annotations

from typing import Any

from weightcache_operator.profiles.base import EngineProfile
from weightcache_operator.profiles.reference import Reference
from weightcache_operator.profiles.sglang import SglangProfile
from weightcache_operator.profiles.vllm import VllmProfile
from weightcache_operator.spec import WeightCache

__all__ = ["DEFAULT", "PROFILES", "EngineProfile", "conflict", "engine_hash_exclude", "profile_of", "register"]

DEFAULT = Reference()
"""The profile of a spec that selects no other."""
PROFILES: dict[str, EngineProfile] = {p.name: p for p in (DEFAULT, SglangProfile(), VllmProfile())}


def register(profile: EngineProfile) -> EngineProfile:
    """Adds ``profile`` to ``PROFILES``; a second profile of one name is refused."""
    if profile.name in PROFILES:
        raise ValueError(f"an engine profile named {profile.name!r} is registered already; pick another name")
    PROFILES[profile.name] = profile
    return profile


def _selecting(cache: WeightCache) -> list[EngineProfile]:
    return [p for p in PROFILES.values() if p.selects(cache)]


def conflict(cache: WeightCache) -> str | None:
    """Why ``cache`` has no one profile (it selects several), or None."""
    chosen = _selecting(cache)
    if len(chosen) < 2:
        return None
    names = " and ".join(f"{p.selector} ({p.name})" for p in chosen)
    return (
        f"the spec selects {len(chosen)} engines at once: {names}; keep the one the engines run and remove the others"
    )


def profile_of(cache: WeightCache) -> EngineProfile:
    """The profile ``cache`` selects; raises on a conflict, which validation reports first."""
    problem = conflict(cache)
    if problem is not None:
        raise ValueError(problem)
    chosen = _selecting(cache)
    return chosen[0] if chosen else DEFAULT


def engine_hash_exclude(cache: WeightCache) -> dict[str, Any]:
    """What of ``spec.engine`` the engine version hash leaves out for the profiles: every profile's
    block while it is unset (so that adding a profile changes no other cache's hash), and what the
    cache's own profile leaves out of its block."""
    unset = {p.field: True for p in PROFILES.values() if p.field and getattr(cache.spec.engine, p.field) is None}
    return {**unset, **profile_of(cache).engine_hash_exclude(cache)}
