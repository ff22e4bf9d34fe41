"""Which daemon ranks fell back to the disk after asking peers (``RankReport.seed.fallback``), so
that each fallback is told once (a ``SeedFellBack`` Warning Event, report.py) and not on every
pass. Keyed by daemon pod uid and rank: a pod started again is another life, told again. Pure,
apart from the memory of what was told."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass

from weightcache_contract.daemon_report import DaemonReport

from weightcache_operator.objects import Object, PodView
from weightcache_operator.observe.daemon_status import Fetched


@dataclass(frozen=True)
class SeedFallback:
    node: str | None
    pod: str
    rank: int
    reason: str

    def message(self) -> str:
        return (
            f"node {self.node}, rank {self.rank} (daemon pod {self.pod}) asked peers for its weights and loaded them"
            f" from the disk: {self.reason}"
        )


class SeedFallbacks:
    """Per cache, the (pod uid, rank) fallbacks told so far. The first pass for a cache after the
    operator starts only notes the fallbacks it finds: they were told before a restart (or happened
    while no operator watched), and telling them again on every restart is noise."""

    def __init__(self) -> None:
        self._told: dict[Hashable, set[tuple[str, int]]] = {}

    def new(self, key: Hashable, pods: list[Object], reports: Mapping[str, Fetched]) -> list[SeedFallback]:
        """The fallbacks among ``reports`` (pod name → report) of ``pods`` (the cache's daemon pods)
        not told before, by node and rank; told from now on. Pods no longer listed are forgotten."""
        found: dict[tuple[str, int], SeedFallback] = {}
        for raw in pods:
            pod = PodView(raw)
            report = reports.get(pod.name)
            if not isinstance(report, DaemonReport):
                continue
            for rank in report.ranks:
                if rank.seed is not None and rank.seed.fallback:
                    found[(pod.uid or pod.name, rank.rank)] = SeedFallback(
                        pod.node, pod.name, rank.rank, rank.seed.fallback
                    )
        first = key not in self._told
        told = self._told.get(key, set())
        listed = {PodView(p).uid or PodView(p).name for p in pods}
        self._told[key] = {t for t in told if t[0] in listed} | set(found)
        if first:
            return []
        fresh = [f for k, f in found.items() if k not in told]
        return sorted(fresh, key=lambda f: (f.node or "", f.rank, f.pod))

    def forget(self, key: Hashable) -> None:
        self._told.pop(key, None)
