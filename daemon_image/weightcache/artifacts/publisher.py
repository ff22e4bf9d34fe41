"""The daemon's side of the artifact directory: publish what engines staged, count hits, evict.

It runs in the daemon pod's launcher (the process that serves ``/status``), which owns the root:
engines see ``entries/`` read-only and write only their own staging directory (store.py). Each
pass looks at every staging directory once it has a claim: a hit is counted (and makes its entry
recently used); a miss is counted, then published once its engine marked it ``READY`` (it served,
so its compilation is done). A staging directory whose engine is gone is removed; after that the
entries are evicted down to the size bound.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from weightcache_contract.daemon_report import ArtifactReport

from .store import ArtifactError, Store

log = logging.getLogger("weightcache.artifacts")
PASS_S = 2.0
"""How often the publisher looks: a staging directory is published this long after its engine served."""


class Publisher:
    def __init__(self, root: str, max_bytes: int) -> None:
        self.store = Store(root)
        self.max_bytes = max_bytes
        self._seen: set[str] = set()
        """Staging directories whose claim was counted."""
        self._done: set[str] = set()
        """Staging directories published, refused or hit: nothing more to do until they go."""
        self._lock = threading.Lock()
        self._counts = {"hits": 0, "misses": 0, "published": 0, "lost_races": 0, "refused": 0, "evicted": 0}
        self._last_problem: str | None = None
        self._stop = threading.Event()

    def create(self) -> None:
        self.store.create()

    def pass_once(self) -> None:
        for staging in self.store.staged():
            self._look_at(staging)
        evicted = self.store.evict(self.max_bytes)
        if evicted:
            log.info("evicted compile artifacts", extra={"fields": {"entries": evicted}})
            self._count("evicted", len(evicted))

    def _look_at(self, staging: Path) -> None:
        name = staging.name
        alive = self.store.owner_alive(staging)
        if name not in self._done:
            try:
                claim = self.store.read_claim(staging)
                if claim is not None:
                    if name not in self._seen:
                        self._seen.add(name)
                        self._count("hits" if claim.hit else "misses", 1)
                    if claim.hit:
                        self.store.record_hit(claim.hit)
                        self._done.add(name)
                    elif (staging / "READY").exists():
                        won = self.store.publish(staging, claim, self.max_bytes)
                        self._count("published" if won else "lost_races", 1)
                        log.info(
                            "published compile artifacts" if won else "compile artifacts were published already",
                            extra={"fields": {"entry": claim.key.digest, "staging": name}},
                        )
                        self._done.add(name)
            except (ArtifactError, OSError) as exc:
                self._done.add(name)
                self._count("refused", 1)
                self._last_problem = f"staging {name} not published: {exc}"
                log.warning(self._last_problem)
        if not alive:
            self.store.remove_staging(staging)
            self._seen.discard(name)
            self._done.discard(name)

    def _count(self, what: str, n: int) -> None:
        with self._lock:
            self._counts[what] += n

    def report(self) -> ArtifactReport:
        entries = self.store.list_entries()
        with self._lock:
            counts = dict(self._counts)
        return ArtifactReport(
            **counts,
            entries=len(entries),
            bytes=sum(e.bytes for e in entries),
            max_bytes=self.max_bytes,
            problem=self._last_problem,
        )

    def run(self, interval_s: float = PASS_S) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.pass_once()
            except OSError as exc:  # a full or vanished disk must not stop the daemon's ranks
                self._last_problem = f"artifact pass failed: {exc}"
                log.warning(self._last_problem)

    def start(self, interval_s: float = PASS_S) -> threading.Thread:
        thread = threading.Thread(target=self.run, args=(interval_s,), name="artifacts", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()
