"""What the operator remembers of each cache between passes, in one place: every holder of
per-cache memory registers here, so that forgetting a cache (gone, or its finalizer owns it) is
one call that cannot miss a holder. tests/unit/operator/run/test_a_forgotten_cache_leaves_nothing_behind.py
finds the reconciler's holders by their ``forget`` and fails for one not registered."""

from __future__ import annotations

from datetime import datetime
from typing import Protocol, TypeVar

from weightcache_operator.vocabulary import CacheKey


class Forgets(Protocol):
    """A holder of per-cache memory: drops all it holds for one cache."""

    def forget(self, key: CacheKey) -> None: ...


H = TypeVar("H", bound=Forgets)


class CacheMemory:
    """The registry of per-cache holders; ``forget`` drops a cache from each of them."""

    def __init__(self) -> None:
        self._holders: list[Forgets] = []

    def holds(self, holder: H) -> H:
        """Registers ``holder`` and returns it (``self.x = memory.holds(X())``)."""
        self._holders.append(holder)
        return holder

    @property
    def holders(self) -> tuple[Forgets, ...]:
        return tuple(self._holders)

    def forget(self, key: CacheKey) -> None:
        for holder in self._holders:
            holder.forget(key)


class SwitchSettles:
    """When each cache's last Service switch of generation has settled (rollout.Plan.switching);
    forgotten on a restart, which costs nothing: the switch was long enough ago by then."""

    def __init__(self) -> None:
        self._settles: dict[CacheKey, datetime] = {}

    def get(self, key: CacheKey) -> datetime | None:
        return self._settles.get(key)

    def set(self, key: CacheKey, when: datetime) -> datetime:
        self._settles[key] = when
        return when

    def forget(self, key: CacheKey) -> None:
        self._settles.pop(key, None)
