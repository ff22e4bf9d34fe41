"""The operator's Prometheus metrics, served on ``$WEIGHTCACHE_OPERATOR_METRICS`` (default
``0.0.0.0:9090``) at ``/metrics``.

- ``weightcache_operator_reconcile_total{namespace,cache,outcome}``: passes, by how they ended
  (``ok``, ``error``: an API error, retried; ``gone``: the object was deleted or is being deleted).
- ``weightcache_operator_reconcile_seconds{namespace,cache,outcome}``: their latency (histogram).
- ``weightcache_operator_caches{phase}``: caches in each phase, every phase listed (0 included).
- ``weightcache_operator_engines{namespace,cache,role}``: Ready engines by role (active, standby).
- ``weightcache_operator_failovers_total{namespace,cache,signal}``: standbys promoted over a
  failed active, by the signal that showed the failure (see failover.py).
- ``weightcache_operator_failover_promotion_seconds{namespace,cache}``: the start of the pass
  that acted → the promoted standby's relabel patched (histogram; ``lastFailover.promotionMs``).
- ``weightcache_operator_failover_detection_seconds{namespace,cache,signal}``: the operator's
  first sight of the failure → the start of the pass that acted, on its own clock
  (histogram; ``lastFailover.detectionMs``, which says what first sight is).
- ``weightcache_operator_daemon_status_reads_total``: ``GET /status`` requests sent to daemon
  pods (daemon_status.py; a pod is read again only when it changed or its report was not settled).
- ``weightcache_operator_pass_step_seconds{step}``: where a pass's time goes, one observation per
  step a pass ran (``PASS_STEPS``; a pass that stops early observes fewer): a slow pass says here
  whether it waited on its reads, its writes or the daemons.
- ``weightcache_operator_pod_reads_total{source}``: how passes read their cache's pods: ``watch``
  (the pod index, watch_index.py) or ``list`` (a LIST: full passes, and passes whose predecessors'
  writes the watch had not delivered yet).
- ``weightcache_operator_watched_reads_total{kind,source}``: the same for every kind a pass may
  read from a watch: ``kind`` is ``pods``, ``daemonsets``, ``services`` or ``budgets``.
- ``weightcache_operator_events_total{outcome}``: Events the operator posted (events.py), by
  outcome: ``sent``, ``failed`` (the API server refused it) or ``dropped`` (too many waiting).
- ``weightcache_operator_rollout_phase{namespace,cache,mode,phase}``: 1 for the phase of the cache's
  latest rollout (``status.rollout``: ``Progressing``, ``Stalled``, ``Complete``), 0 for the others;
  no series for a cache that has had no rollout.
- ``weightcache_operator_rollout_updated_replicas{namespace,cache}`` and
  ``weightcache_operator_rollout_replicas{namespace,cache}``: that rollout's ``updated`` and
  ``total``: how far it got.
- ``weightcache_operator_engine_start_seconds{namespace,cache,phase}``: each engine pod's start,
  observed once per pod when the operator first sees it Ready (engine_start.py): for each phase
  (``scheduled``, ``started``, ``ready``) the seconds since the pod's creation at which it ended,
  from the API's timestamps (whole seconds); ``ready`` is the whole start. Start buckets (1 s to
  20 min), not the latency buckets.
- ``weightcache_operator_api_request_seconds{verb}``: every request the operator sent to the API
  server, as long as it waited for the answer (``GET``, ``LIST``, ``POST``, ``PATCH``, ``APPLY``,
  ``DELETE``): the API server's latency as the operator sees it.

The writer is ``weightcache_contract.prometheus`` (standard library only), so no new dependency.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import get_args

from weightcache_contract.prometheus import STARTUP_BUCKETS, Metrics
from weightcache_contract.readonly_http import PROMETHEUS_TEXT, ReadOnlyServer, parse_addr

from weightcache_operator.observe.engine_start import EngineStart
from weightcache_operator.settings import METRICS
from weightcache_operator.spec import Phase, RolloutStatus, WeightCacheStatus

PHASES: tuple[str, ...] = get_args(Phase)
ROLLOUT_PHASES: tuple[str, ...] = get_args(RolloutStatus.model_fields["phase"].annotation)
PASS_STEPS = ("observe", "plan", "execute", "daemon-status", "status")
"""A pass's steps in their order (reconcile.py): the reads, planning (pass_plan.py: with a daemon
spec change, the daemons' reports its strategy reads), carrying out the one list of actions
(DaemonSets, gates, engines, Service, InferencePool, budget), the daemons' ``/status`` reads, the
status patch and Events."""


class OperatorMetrics:
    """Counters and histograms accumulate; the per-cache gauges are recomputed from the latest
    state of every cache at each change, so a deleted cache's series disappear."""

    def __init__(self) -> None:
        self.registry = Metrics()
        m = self.registry
        m.describe("weightcache_operator_reconcile_total", "counter", "reconciliation passes by cache and outcome")
        m.describe(
            "weightcache_operator_reconcile_seconds", "histogram", "reconciliation pass latency by cache and outcome"
        )
        m.describe("weightcache_operator_caches", "gauge", "WeightCaches in each phase")
        m.describe("weightcache_operator_engines", "gauge", "Ready engine pods by cache and role")
        m.describe(
            "weightcache_operator_failovers_total", "counter", "standbys promoted over a failed active, by signal"
        )
        m.describe(
            "weightcache_operator_failover_promotion_seconds",
            "histogram",
            "start of the pass that acted to the promoted standby's relabel patched",
        )
        m.describe(
            "weightcache_operator_failover_detection_seconds",
            "histogram",
            "operator's first sight of the failure to the start of the pass that acted",
        )
        m.describe("weightcache_operator_daemon_status_reads_total", "counter", "GET /status requests sent to daemons")
        m.describe("weightcache_operator_pass_step_seconds", "histogram", "time passes spent in each step")
        m.describe(
            "weightcache_operator_api_request_seconds",
            "histogram",
            "API server requests sent by the operator, by verb, until their answer",
        )
        m.describe("weightcache_operator_events_total", "counter", "Events posted, by outcome")
        m.describe("weightcache_operator_pod_reads_total", "counter", "passes' reads of their pods, by source")
        m.describe(
            "weightcache_operator_watched_reads_total", "counter", "passes' reads of their objects, by kind and source"
        )
        m.describe("weightcache_operator_rollout_phase", "gauge", "1 for the phase of each cache's latest rollout")
        m.describe(
            "weightcache_operator_rollout_updated_replicas", "gauge", "replicas the latest rollout has moved over"
        )
        m.describe("weightcache_operator_rollout_replicas", "gauge", "replicas the latest rollout moves over in all")
        m.describe(
            "weightcache_operator_engine_start_seconds",
            "histogram",
            "engine pods' starts: seconds since the pod's creation at which each phase ended",
            buckets=STARTUP_BUCKETS,
        )
        self._lock = threading.Lock()
        self._caches: dict[tuple[str, str], tuple[str, int, int]] = {}  # phase, active, standby
        self._rollouts: dict[tuple[str, str], RolloutStatus] = {}
        self._publish()

    def pass_done(self, namespace: str, cache: str, outcome: str, seconds: float) -> None:
        self.registry.inc("weightcache_operator_reconcile_total", namespace=namespace, cache=cache, outcome=outcome)
        self.registry.observe(
            "weightcache_operator_reconcile_seconds", seconds, namespace=namespace, cache=cache, outcome=outcome
        )

    def stopwatch(self, clock: Callable[[], float] = time.perf_counter) -> Stopwatch:
        """A pass's stopwatch, started now: each ``lap(step)`` is observed as that step's time."""
        return Stopwatch(
            lambda step, seconds: self.registry.observe("weightcache_operator_pass_step_seconds", seconds, step=step),
            clock,
        )

    def read_by(self, kind: str, source: str) -> None:
        """How a pass read one kind of its cache's objects (observe/snapshot.py)."""
        if kind == "pods":
            self.registry.inc("weightcache_operator_pod_reads_total", source=source)
        self.registry.inc("weightcache_operator_watched_reads_total", kind=kind, source=source)

    def event(self, outcome: str) -> None:
        self.registry.inc("weightcache_operator_events_total", outcome=outcome)

    def api_request(self, verb: str, seconds: float) -> None:
        self.registry.observe("weightcache_operator_api_request_seconds", seconds, verb=verb)

    def failover(
        self, namespace: str, cache: str, signal: str, detection_ms: float | None, promotion_ms: float
    ) -> None:
        self.registry.inc("weightcache_operator_failovers_total", namespace=namespace, cache=cache, signal=signal)
        self.registry.observe(
            "weightcache_operator_failover_promotion_seconds", promotion_ms / 1000, namespace=namespace, cache=cache
        )
        if detection_ms is not None:
            self.registry.observe(
                "weightcache_operator_failover_detection_seconds",
                detection_ms / 1000,
                namespace=namespace,
                cache=cache,
                signal=signal,
            )

    def engine_started(self, namespace: str, cache: str, start: EngineStart) -> None:
        for phase, seconds in start.seconds.items():
            self.registry.observe(
                "weightcache_operator_engine_start_seconds", seconds, namespace=namespace, cache=cache, phase=phase
            )

    def daemon_status_reads(self, reads: int) -> None:
        self.registry.inc("weightcache_operator_daemon_status_reads_total", reads)

    def forget(self, key: tuple[str, str]) -> None:
        """The cache is gone: its gauges go too (memory.py)."""
        self.cache_status(key[0], key[1], None)

    def cache_status(self, namespace: str, cache: str, status: WeightCacheStatus | None) -> None:
        """The status just written for a cache; None once the cache is gone."""
        with self._lock:
            if status is None:
                self._caches.pop((namespace, cache), None)
                self._rollouts.pop((namespace, cache), None)
            else:
                self._caches[(namespace, cache)] = (
                    str(status.phase),
                    status.active_engines or 0,
                    status.standby_engines or 0,
                )
                # A pass that stops before planning writes no rollout; the object keeps its last
                # one (a merge patch), and so do the gauges.
                if status.rollout is not None:
                    self._rollouts[(namespace, cache)] = status.rollout
            self._publish()

    def render(self) -> str:
        return self.registry.render()

    def _publish(self) -> None:
        caches = self._caches.values()
        self.registry.replace(
            "weightcache_operator_caches",
            [(sum(p == phase for p, _a, _s in caches), {"phase": phase}) for phase in PHASES],
        )
        self.registry.replace(
            "weightcache_operator_engines",
            [
                (count, {"namespace": namespace, "cache": cache, "role": role})
                for (namespace, cache), (_phase, active, standby) in sorted(self._caches.items())
                for role, count in (("active", active), ("standby", standby))
            ],
        )
        rollouts = sorted(self._rollouts.items())
        self.registry.replace(
            "weightcache_operator_rollout_phase",
            [
                (
                    float(rollout.phase == phase),
                    {"namespace": ns, "cache": cache, "mode": rollout.mode or "", "phase": phase},
                )
                for (ns, cache), rollout in rollouts
                for phase in ROLLOUT_PHASES
            ],
        )
        self.registry.replace(
            "weightcache_operator_rollout_updated_replicas",
            [(rollout.updated, {"namespace": ns, "cache": cache}) for (ns, cache), rollout in rollouts],
        )
        self.registry.replace(
            "weightcache_operator_rollout_replicas",
            [(rollout.total, {"namespace": ns, "cache": cache}) for (ns, cache), rollout in rollouts],
        )


class Stopwatch:
    """``lap(step)`` charges ``step`` the time since the previous lap (or since the start). The
    laps are also kept, summed per step, so that a slow pass can say where its time went."""

    def __init__(self, observe: Callable[[str, float], None], clock: Callable[[], float]) -> None:
        self._observe, self._clock = observe, clock
        self._start = self._last = clock()
        self.laps: dict[str, float] = {}
        """Seconds per step, in the order first lapped; a step lapped twice (the gates) adds up."""

    def lap(self, step: str) -> None:
        now = self._clock()
        self._observe(step, now - self._last)
        self.laps[step] = self.laps.get(step, 0.0) + now - self._last
        self._last = now

    def elapsed(self) -> float:
        return self._clock() - self._start

    def steps_ms(self) -> dict[str, int]:
        """The laps in whole milliseconds, for a log line."""
        return {step: round(seconds * 1000) for step, seconds in self.laps.items()}


def metrics_server(metrics: OperatorMetrics, addr: str) -> ReadOnlyServer:
    """The ``/metrics`` endpoint on ``addr`` (``$WEIGHTCACHE_OPERATOR_METRICS``), bound (a taken
    port fails the operator's startup, loudly)."""
    return ReadOnlyServer(
        parse_addr(addr, f"${METRICS}"),
        {"/metrics": lambda: (PROMETHEUS_TEXT, metrics.render().encode())},
        what="operator metrics",
    )
