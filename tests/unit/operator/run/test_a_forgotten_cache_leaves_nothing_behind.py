"""Forgetting a cache (gone, or its finalizer owns it) is one call (run/memory.py): every holder
of per-cache memory on the reconciler is registered, and none keeps anything of the cache."""

from __future__ import annotations

import threading
import types
from typing import Any

from pass_world import World, serving
from weightcache_operator.run.memory import CacheMemory

KEY = ("ns", "tiny")
KEPT = ("metrics.registry",)
"""What outlives a cache on purpose: the operator's counters and histograms (a Prometheus counter
never goes back); its gauges of the cache (phase, engines, rollout) are memory and go."""


def _holders_found_on(reconciler: object) -> dict[str, object]:
    """The reconciler's attributes that can forget a cache: what a new holder would be, too."""
    return {
        name: value
        for name, value in vars(reconciler).items()
        if callable(getattr(value, "forget", None)) and not isinstance(value, CacheMemory)
    }


def _traces(value: Any, path: str, seen: set[int], found: list[str]) -> None:
    """Where ``value`` still names the cache: its key, or a name of the cache or its pods."""
    if isinstance(value, str):
        if value == "tiny" or value.startswith("tiny-"):
            found.append(path)
        return
    if path in KEPT:
        return
    if value is None or isinstance(value, (int, float, bool, bytes, type, types.ModuleType)) or id(value) in seen:
        return
    if callable(value) and not hasattr(value, "__dict__"):
        return
    if isinstance(value, (threading.Thread, type(threading.Lock()), type(threading.RLock()))):
        return
    seen.add(id(value))
    if value == KEY:
        found.append(path)
        return
    if isinstance(value, dict):
        for k, v in list(value.items()):
            _traces(k, f"{path}[key {k!r}]", seen, found)
            _traces(v, f"{path}[{k!r}]", seen, found)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(list(value)):
            _traces(item, f"{path}[{i}]", seen, found)
    elif hasattr(value, "__dict__") and not isinstance(value, types.FunctionType | types.MethodType):
        for name, item in vars(value).items():
            _traces(item, f"{path}.{name}", seen, found)


def _cache_gone(world: World) -> None:
    world.api.remove("WeightCache", "tiny")
    assert world.run() is None


def test_every_holder_of_per_cache_memory_on_the_reconciler_is_registered_to_be_forgotten() -> None:
    reconciler = World().reconciler

    found = _holders_found_on(reconciler)

    assert found, "the reconciler holds per-cache memory (engine nodes, sightings, ...)"
    registered = [id(holder) for holder in reconciler.memory.holders]
    unregistered = sorted(name for name, holder in found.items() if id(holder) not in registered)
    assert unregistered == [], f"register these with Reconciler.memory.holds(...): {unregistered}"


def test_a_forgotten_cache_leaves_nothing_behind_in_any_holder() -> None:
    world = serving(World())
    failed = world.api.stored("Pod", "tiny-0-00001")
    failed["status"]["phase"] = "Failed"
    world.api.put("Pod", failed)
    world.run()  # a failover: sightings, starts, engine nodes and metrics now hold the cache
    before: list[str] = []
    for name, holder in _holders_found_on(world.reconciler).items():
        _traces(holder, name, set(), before)
    assert before, "the passes left per-cache memory for the test to see forgotten"

    _cache_gone(world)

    after: list[str] = []
    for name, holder in _holders_found_on(world.reconciler).items():
        _traces(holder, name, set(), after)
    assert after == []
