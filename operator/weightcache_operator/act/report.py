"""What a pass tells: the cache's status (merge-patched only when it differs), the Events of
phase changes, failures, rollouts, slow engine starts and failovers (sent off the pass:
events.py), and the failover and engine start metrics. The rollout, engine start and failover
reports are returned as typed parts of the status (plan/status_reports.py), which the pass adds
to it in one step: nothing here changes a status."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from weightcache_operator.act.events import EventSink
from weightcache_operator.act.metrics import OperatorMetrics
from weightcache_operator.kubeapi import ApiError, KubeApi
from weightcache_operator.objects import Object, stamp
from weightcache_operator.observe.engine_start import EngineStart, latest, slow_after, slow_message
from weightcache_operator.observe.seed_fallbacks import SeedFallback
from weightcache_operator.observe.sightings import Sightings
from weightcache_operator.observe.snapshot import cache_path
from weightcache_operator.plan.actions import Promotion
from weightcache_operator.plan.failover import failover_status
from weightcache_operator.plan.reasons import failure_events
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.status import rollout_conditions, rollout_status
from weightcache_operator.plan.rollout.strategy import Strategy
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.rollout_timing import replica_timings
from weightcache_operator.plan.status_reports import RolloutReport
from weightcache_operator.spec import EngineStartStatus, FailoverStatus, WeightCacheStatus
from weightcache_operator.vocabulary import MANAGED_BY, STRATEGY_ANNOTATION, STRATEGY_REASON_ANNOTATION

log = logging.getLogger("weightcache_operator.act.report")


class Reporter:
    def __init__(
        self,
        api: KubeApi,
        clock: Callable[[], datetime],
        metrics: OperatorMetrics,
        sightings: Sightings,
        events: EventSink,
    ) -> None:
        self.api = api
        self.clock = clock
        self.metrics = metrics
        self.sightings = sightings
        self.events = events

    def write_status(self, body: Object, typed: WeightCacheStatus, previous: WeightCacheStatus) -> None:
        """Patches the status (its fields that were set: ``WeightCacheStatus.wire``) unless every
        one already says so; Events for a new phase and for each newly failing condition, against
        ``previous``, the status the pass read (Snapshot.previous)."""
        status = typed.wire()
        meta = body["metadata"]
        if typed.phase is not None and previous.phase != typed.phase:
            self.event(
                body,
                "Warning" if typed.phase in ("Failed", "Degraded") else "Normal",
                f"Phase{typed.phase}",
                _phase_message(typed),
            )
            log.info("phase", extra={"cache": meta["name"], "namespace": meta["namespace"], "phase": typed.phase})
        for reason, message in failure_events(previous.conditions, typed.conditions):
            self.event(body, "Warning", reason, message)
        # Whether to patch is decided on the wire, against what the API holds, as it holds it.
        old = body.get("status") or {}
        if all(old.get(k) == v for k, v in status.items()):
            return
        try:
            self.api.patch(cache_path(meta["namespace"], meta["name"]) + "/status", {"status": status})
        except ApiError as error:
            if error.status != 404:
                raise

    def event(self, body: Object, kind: str, reason: str, message: str) -> None:
        """Hands the Event to the sink (events.py): the pass does not wait for it to be sent."""
        meta = body["metadata"]
        now = stamp(self.clock())
        event = {
            "metadata": {
                "generateName": f"{meta['name']}.",
                "namespace": meta["namespace"],
                "labels": dict(MANAGED_BY),
            },
            "involvedObject": {
                "apiVersion": body["apiVersion"],
                "kind": body["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "source": {"component": "weightcache-operator"},
        }
        self.events.post(meta["namespace"], event)

    def rollout(
        self,
        body: Object,
        previous: WeightCacheStatus,
        steps: Plan,
        want: Desired,
        decision: tuple[Strategy, str] | None,
        engines: list[Object],
    ) -> RolloutReport:
        """``status.rollout`` (with each replica's start, promotion and drain times:
        rollout_timing.py) and the rollout conditions; posts an Event when a rollout starts,
        stalls or completes. ``previous``: the status the pass read (Snapshot.previous), which
        the rollout goes on from; ``decision``: how the generation change was decided
        (``strategy_decision``); ``engines``: the engine pods as the pass left them."""
        now = self.clock()
        before = previous.rollout
        rollout = rollout_status(steps, want, now, before)
        if rollout is not None:
            # Always written (a merge patch replaces a list whole): a new rollout's empty list
            # replaces the previous rollout's.
            rollout = rollout.model_copy(update={"replicas": replica_timings(before, steps, want, engines, now)})
        strategy = decision if steps.mode == "Generation" else None
        extra = rollout_conditions(steps, now, previous.conditions, body["metadata"].get("generation"))
        if rollout is not None and (before.phase if before is not None else None) != rollout.phase:
            kind = "Warning" if rollout.phase == "Stalled" else "Normal"
            message = rollout.message or f"{rollout.mode} rollout: {rollout.current_step}"
            if strategy is not None and rollout.phase == "Progressing":
                message += f"; {strategy[0]}: {strategy[1]}"
            self.event(body, kind, f"Rollout{rollout.phase}", message)
        return RolloutReport(rollout, tuple(extra))

    def engine_starts(
        self, body: Object, starts: list[EngineStart], ready_deadline_seconds: float
    ) -> EngineStartStatus | None:
        """Engine pods seen Ready for the first time (engine_start.StartWatch): each start into
        the histogram and a Warning ``SlowEngineStart`` Event for each slow one. Returns the
        latest, for ``status.lastEngineStart``; None when no engine started (the field is then
        left as it was: a merge patch)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        threshold = slow_after(ready_deadline_seconds)
        for start in starts:
            self.metrics.engine_started(namespace, name, start)
            log.info(
                "engine started",
                extra={"cache": name, "namespace": namespace, "pod": start.pod, "seconds": start.seconds},
            )
            if start.total >= threshold:
                self.event(body, "Warning", "SlowEngineStart", slow_message(start, ready_deadline_seconds))
        last = latest(starts)
        return last.status(threshold) if last is not None else None

    def seed_fallbacks(self, body: Object, fallbacks: list[SeedFallback]) -> None:
        """A Warning ``SeedFellBack`` Event for each rank that asked peers and loaded from the disk
        after all (seed_fallbacks.py tells each once per daemon pod and rank)."""
        for fallback in fallbacks:
            self.event(body, "Warning", "SeedFellBack", fallback.message())

    def failover(self, body: Object, promotion: Promotion, noticed: datetime) -> FailoverStatus | None:
        """The ``status.lastFailover`` entry of a promotion just patched (every field set:
        ``FailoverStatus.whole``), its Event and metrics; None when it was no failover (an
        active that never got Ready swapped for a Ready one)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        seen = self.sightings.first((namespace, name), promotion.failed_pods)
        record = failover_status(promotion, noticed, self.clock(), seen)
        log.info("promoted standby", extra={"cache": name, "namespace": namespace, **record.wire()})
        if promotion.failure is None:
            return None
        self.metrics.failover(namespace, name, promotion.failure.signal, record.detection_ms, record.promotion_ms)
        failed = "no active" if record.from_ is None else record.from_
        self.event(
            body,
            "Warning",
            "Failover",
            f"replica {promotion.replica}: {failed} failed ({promotion.failure.detail}); "
            f"promoted {record.to} in {record.promotion_ms} ms",
        )
        return record.whole()


def strategy_decision(current_sets: list[Object]) -> tuple[Strategy, str] | None:
    """How the change to the current daemon spec was decided, as recorded on its DaemonSet."""
    for ds in current_sets:
        annotations = ds["metadata"].get("annotations") or {}
        strategy = annotations.get(STRATEGY_ANNOTATION)
        if strategy == "BlueGreen" or strategy == "NodeByNode":
            return strategy, annotations.get(STRATEGY_REASON_ANNOTATION, "")
    return None


def _phase_message(status: WeightCacheStatus) -> str:
    degraded = next((c for c in status.conditions if c.type == "Degraded"), None)
    if degraded and degraded.status == "True":
        return str(degraded.message)
    return f"nodes ready {status.ready_nodes}, active {status.active_engines}, standby {status.standby_engines}"
