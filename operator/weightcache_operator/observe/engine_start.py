"""How long each engine pod took to start, read from the pod object alone: created → scheduled →
containers started → Ready. Pure, apart from ``StartWatch``'s memory of the pods already counted.

The times are the API server's: ``metadata.creationTimestamp``, the ``PodScheduled`` and ``Ready``
conditions' ``lastTransitionTime`` and the containers' ``state.running.startedAt``. They cost no
request (every pass has the pods), and they are the cluster's view of a start, which includes what
the engine cannot see of itself (scheduling, pulling the image, creating the container). The API
keeps them to the whole second, truncated, so each phase is known to ±1 s: the engine's own
timeline (``weightcache_engine_startup_seconds``, the ``startup`` log lines) splits the time after
its process started more finely.

Each phase is the seconds since the pod's creation at which it ended, as the engine's timeline
counts from its process start: ``ready`` is the whole start.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from datetime import datetime

from weightcache_operator.objects import Object, PodView, parse_time, truncated
from weightcache_operator.spec import EngineStartStatus

START_PHASES = ("scheduled", "started", "ready")
"""``scheduled``: bound to a node; ``started``: every container running (image pulled, process
started); ``ready``: the pod's Ready condition True (the engine's readiness probe and the
operator's daemon-ready gate both passed)."""

SLOW_START_SHARE = 0.5
"""A start is slow once it took half of ``spec.engine.rollout.readyDeadlineSeconds``: the deadline
is how long the user says a start may take before a rollout stalls on it, so half of it is a
warning while there is still room, in the user's own units (a GPU engine that compiles for
minutes has a longer deadline than a CPU one), with no second setting to keep in step."""


@dataclass(frozen=True)
class EngineStart:
    """One engine pod's start as the API server recorded it."""

    pod: str
    uid: str
    replica: int | None
    node: str | None
    created: datetime
    ready_at: datetime
    seconds: dict[str, float]
    """Phase → seconds since creation at which it ended, in ``START_PHASES`` order; a phase the
    pod does not show (no ``PodScheduled`` condition) is left out."""
    restarts: int
    """Container restarts before Ready: a start that crashed on its way counts them."""

    @property
    def total(self) -> float:
        return self.seconds["ready"]

    def status(self, slow_after: float) -> EngineStartStatus:
        """``status.lastEngineStart``. ``replica`` and ``node`` are set even when unknown (written
        as null: the previous start's must not survive a merge patch); a phase the pod does not
        show is left unset."""
        return EngineStartStatus(
            pod=self.pod,
            replica=self.replica,
            node=self.node,
            created_at=truncated(self.created),
            ready_at=truncated(self.ready_at),
            **{f"{phase}_seconds": seconds for phase, seconds in self.seconds.items()},
            restarts=self.restarts,
            slow=self.total >= slow_after,
        )


def engine_start(pod: Object) -> EngineStart | None:
    """The pod's start, once it is Ready; None before (or without the timestamps to tell)."""
    view = PodView(pod)
    created = view.created
    ready = view.condition("Ready")
    ready_at = parse_time(ready.get("lastTransitionTime")) if ready and ready.get("status") == "True" else None
    if created is None or ready_at is None or view.uid is None:
        return None
    ends: dict[str, datetime | None] = {
        "scheduled": _true_since(view, "PodScheduled"),
        "started": _containers_started(view),
        "ready": ready_at,
    }
    seconds: dict[str, float] = {}
    previous = 0.0
    total = max((ready_at - created).total_seconds(), 0.0)
    for phase in START_PHASES:
        end = ends[phase]
        if end is None:
            continue
        # Clamped into [previous phase, ready]: every stamp is truncated to the second on its own.
        previous = seconds[phase] = min(max((end - created).total_seconds(), previous), total)
    return EngineStart(
        pod=view.name,
        uid=view.uid,
        replica=view.replica,
        node=view.node,
        created=created,
        ready_at=ready_at,
        seconds=seconds,
        restarts=sum(int(s.get("restartCount") or 0) for s in view.container_statuses),
    )


def slow_after(ready_deadline_seconds: float) -> float:
    """Seconds from which a start is slow (``SLOW_START_SHARE`` of the rollout's deadline)."""
    return ready_deadline_seconds * SLOW_START_SHARE


def slow_message(start: EngineStart, ready_deadline_seconds: float) -> str:
    """The Warning Event's message: how long, where the time went, and where to look."""
    phases = ", ".join(f"{phase} {seconds:.0f}s" for phase, seconds in start.seconds.items())
    restarted = f" after {start.restarts} container restart(s)" if start.restarts else ""
    return (
        f"engine pod {start.pod} (replica {start.replica}, node {start.node}) took {start.total:.0f}s from creation"
        f" to Ready{restarted} (since creation: {phases}); a start is slow from {slow_after(ready_deadline_seconds):g}s,"
        f" half of engine.rollout.readyDeadlineSeconds ({ready_deadline_seconds:g}s), where a rollout stalls."
        " The engine's own log (startup lines) or its weightcache_engine_startup_seconds split the time after"
        " its process started"
    )


def latest(starts: list[EngineStart]) -> EngineStart | None:
    """The start that ended last (ties: the pod name)."""
    return max(starts, key=lambda s: (s.ready_at, s.pod), default=None)


class StartWatch:
    """Which engine pods' starts were counted already, per cache, so that each start is observed
    once and not on every pass. The first pass for a cache after the operator starts (or takes
    the cache over) only notes the pods already Ready: their start happened before this operator
    watched, and after a restart it would count them twice. A pod whose Ready later flips (a
    readiness probe, a daemon outage) is not counted again: its start was counted when it began
    serving."""

    def __init__(self) -> None:
        self._counted: dict[Hashable, set[str]] = {}

    def new_starts(self, key: Hashable, pods: list[Object]) -> list[EngineStart]:
        """The starts among ``pods`` (the cache's engine pods) not counted before, oldest first;
        they are counted from now on. Pods no longer listed are forgotten."""
        starts = [s for s in map(engine_start, pods) if s is not None]
        first = key not in self._counted
        counted = self._counted.get(key, set())
        fresh = [] if first else [s for s in starts if s.uid not in counted]
        listed = {uid for uid in (PodView(p).uid for p in pods) if uid}
        self._counted[key] = (counted & listed) | {s.uid for s in starts}
        return sorted(fresh, key=lambda s: (s.ready_at, s.pod))

    def forget(self, key: Hashable) -> None:
        self._counted.pop(key, None)


def _true_since(view: PodView, kind: str) -> datetime | None:
    found = view.condition(kind)
    return parse_time(found.get("lastTransitionTime")) if found and found.get("status") == "True" else None


def _containers_started(view: PodView) -> datetime | None:
    """When the last of the pod's containers started running (None unless every one runs)."""
    starts = [
        parse_time(((s.get("state") or {}).get("running") or {}).get("startedAt")) for s in view.container_statuses
    ]
    running = [s for s in starts if s is not None]
    return max(running) if running and len(running) == len(starts) else None
