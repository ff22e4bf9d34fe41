"""Level-based reconciliation of one WeightCache: read what exists, compare with what the pure
planners say should exist, and close the gap. Every pass starts from the cluster's state, read
from the API server or the operator's watches (watch_index.py says when the watches will do), so
a pass can be repeated, interrupted or run by another replica without harm.

A pass: observe (snapshot.py) → plan one list of actions (pass_plan.py: the daemons' DaemonSets
on spec changes and resyncs, the readiness gates, the engines, the Service and the budget, each
planned on what the writes before it will leave; actions.py, in ``actions.ORDER``) → carry it out
(executor.py, which writes the API's answers into the snapshot) → status and Events (status.py,
report.py; the Events are sent off the pass, events.py). The status is the typed
``WeightCacheStatus`` from its first line: aggregated from what the pass saw, then completed with
the rooms' typed reports in one step (status_reports.py), then written once. A pass returns what
it did: the actions carried out, in order, and the status it wrote.

The kopf handlers (handlers.py) only decide *when* a pass runs; runner.py serialises the passes
of a cache. Everything here is plain, synchronous code against ``KubeApi`` (run in kopf's
handler threads).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, cast

from weightcache_operator.act.events import EventSink
from weightcache_operator.act.executor import execute
from weightcache_operator.act.finalizer import StillTerminating, finalize
from weightcache_operator.act.metrics import OperatorMetrics
from weightcache_operator.act.report import Reporter, strategy_decision
from weightcache_operator.kubeapi import ApiError, KubeApi
from weightcache_operator.objects import PodView
from weightcache_operator.observe.daemon_changes import DaemonChanges
from weightcache_operator.observe.daemon_status import DaemonStatusReader
from weightcache_operator.observe.engine_nodes import EngineNodes
from weightcache_operator.observe.engine_start import StartWatch
from weightcache_operator.observe.node_index import NodeIndex
from weightcache_operator.observe.responsiveness import ResponsivenessWatch, probe_url
from weightcache_operator.observe.seed_fallbacks import SeedFallbacks
from weightcache_operator.observe.sightings import Sightings
from weightcache_operator.observe.snapshot import Snapshot, observe
from weightcache_operator.observe.watch_index import Watches
from weightcache_operator.plan.actions import Action
from weightcache_operator.plan.engine_plan import desired
from weightcache_operator.plan.pass_plan import plan_pass
from weightcache_operator.plan.podsecurity import REASON as POD_SECURITY_REASON
from weightcache_operator.plan.podsecurity import pod_security_problem
from weightcache_operator.plan.rollout.generation import SWITCH_SETTLE_SECONDS
from weightcache_operator.plan.rollout.status import change_under_way
from weightcache_operator.plan.seeding import peers_behind
from weightcache_operator.plan.status import Observed, aggregate, invalid_status
from weightcache_operator.plan.status_reports import StatusReports, completed
from weightcache_operator.render.gpu_holder import uses_gpu_holder
from weightcache_operator.run.alarms import Alarms
from weightcache_operator.run.handover import HandOver
from weightcache_operator.run.memory import CacheMemory, SwitchSettles
from weightcache_operator.run.runner import PassRunner
from weightcache_operator.spec import WeightCache, WeightCacheStatus
from weightcache_operator.together import THREADS
from weightcache_operator.vocabulary import CacheKey

__all__ = ["PassResult", "Reconciler", "StillTerminating"]

log = logging.getLogger("weightcache_operator.run.reconcile")

SLOW_PASS_SECONDS = 1.0
"""A pass at least this long is logged with the time of each of its steps (``slow pass``): the
pass latency target at scale (docs/benchmarks.md), so each pass that misses it says why."""


@dataclass(frozen=True)
class PassResult:
    """What one pass did: every action handed to the executor, in the order carried out, and the
    status it wrote."""

    actions: tuple[Action, ...]
    status: WeightCacheStatus


class Reconciler:
    """Passes over caches; one at a time per cache, bursts of triggers coalesced into one rerun."""

    def __init__(
        self,
        api: KubeApi,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        daemon_status: DaemonStatusReader | None = None,
        metrics: OperatorMetrics | None = None,
        nodes: NodeIndex | None = None,
        requests: Executor | None | Literal["pool"] = "pool",
    ) -> None:
        self.api = api
        self.memory = CacheMemory()
        """Every holder of per-cache memory below registers here: forgetting a cache is one call."""
        self.nodes = nodes or NodeIndex()
        """The nodes passes read: handlers.py feeds it from the node watch."""
        self.watches = Watches()
        """Each cache's pods, DaemonSets, Services and budget as the watches delivered them:
        handlers.py feeds them; passes that events trigger read them once they hold their
        predecessors' writes (watch_index.py)."""
        self.engine_nodes = self.memory.holds(EngineNodes())
        """Where each cache's engine pods are, as its latest pass saw them."""
        self.clock = clock
        self.metrics = self.memory.holds(metrics or OperatorMetrics())
        api.timed = self.metrics.api_request
        self._requests = (
            ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="api-request")
            if requests == "pool"
            else requests
        )
        """Where a pass's independent requests run at once (together.py); shared by all passes. None
        (``requests``): one after another on the pass's thread, in the order the pass hands them over."""
        self._switch_settles = self.memory.holds(SwitchSettles())
        self.starts = self.memory.holds(StartWatch())
        """Which engine pods' starts were counted (engine_start.py): each once, not once per pass."""
        self.seed_fallbacks = self.memory.holds(SeedFallbacks())
        """Which daemon ranks' seed fallbacks were told (seed_fallbacks.py): each once."""
        self.sightings = self.memory.holds(Sightings())
        """The operator's first sight of each engine failure (what failover detection is timed from):
        the kopf handlers report watch events' arrival, passes what they saw."""
        self.daemon_status = self.memory.holds(
            daemon_status or DaemonStatusReader(counted=self.metrics.daemon_status_reads)
        )
        self.daemon_changes = self.memory.holds(DaemonChanges(self.daemon_status, self._heard))
        """Long polls of the Ready daemon pods: a report that changes (a checkpoint re-synced
        under a daemon) wakes a pass within about a second (daemon_changes.py)."""
        self.events = EventSink(
            lambda namespace, event: api.create(f"/api/v1/namespaces/{namespace}/events", event),
            counted=self.metrics.event,
        )
        """Where passes' Events go: sent off the pass, in order (events.py)."""
        self.reporter = Reporter(api, clock, self.metrics, self.sightings, self.events)
        self._runner = PassRunner()
        self._guard = threading.Lock()
        self.alarms = self.memory.holds(Alarms(self._woken))
        """Wake-ups for decisions that change with time alone (a gate kept through a daemon outage)."""
        self.responsiveness = self.memory.holds(ResponsivenessWatch(self._woken))
        """The operator's own probes of Ready engines (``unresponsiveAfterMilliseconds``)."""
        self._acting: set[Hashable] = set()
        """Caches this replica acts for (handlers.acting): passes, alarms and probes run only there."""
        self.handover: HandOver | None = None
        """The replicas' lease (handover.py), set by the operator at start-up: with it, a pass
        runs only for a cache this replica acts for and only while it holds the lease."""

    # --- entry points ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, apply: bool = True) -> PassResult | None:
        """One pass for the cache; ``apply`` also applies DaemonSets and Service where they differ (on
        spec changes and the periodic resync; pod events skip it). Returns what the pass did,
        None when the cache is gone or this trigger was folded into the running pass."""

        def one_pass(apply: bool) -> PassResult | None:
            if not self._enter((namespace, name)):
                return None
            stopwatch, outcome = self.metrics.stopwatch(), "error"
            try:
                result = self._pass(namespace, name, apply, stopwatch.lap)
                outcome = "ok" if result is not None else "gone"
                return result
            finally:
                seconds = stopwatch.elapsed()
                if outcome == "error":
                    # A write that failed may still have been carried out (an answer lost to a
                    # timeout): the next pass LISTs rather than trust the watch to hold it.
                    self.watches.unchecked((namespace, name))
                self.metrics.pass_done(namespace, name, outcome, seconds)
                if seconds >= SLOW_PASS_SECONDS:
                    log.warning(
                        "slow pass",
                        extra={
                            "cache": name,
                            "namespace": namespace,
                            "outcome": outcome,
                            "seconds": round(seconds, 3),
                            "steps_ms": stopwatch.steps_ms(),
                        },
                    )
                if self.handover is not None:
                    self.handover.leave()

        return self._runner.run((namespace, name), apply, one_pass)

    def acting(self, key: CacheKey, on: bool) -> None:
        """Whether this replica acts for the cache ``key`` (kopf's daemon for it runs). Off: its
        alarms and engine probes stop, so a replica paused by peering runs no pass of its own.
        On: one full pass once the lease is held (at once when it is): the triggers refused
        while it was not may have been the last ones for a while."""
        with self._guard:
            if on:
                self._acting.add(key)
            else:
                self._acting.discard(key)
            anything = bool(self._acting)
        if self.handover is not None:
            self.handover.want(anything)
            if on and self.handover.held():
                self._wake_all([key])
        namespace, name = key
        log.info(
            "acting for the cache" if on else "no longer acting for the cache",
            extra={"cache": name, "namespace": namespace},
        )
        if not on:
            self.alarms.cancel(key)
            self.responsiveness.forget(key)
            self.daemon_changes.forget(key)
            self.sightings.forget(key)  # events are not handled while paused: what we saw may be stale
            self.starts.forget(key)

    def finalize(self, namespace: str, name: str) -> None:
        """finalizer.finalize: raises ``StillTerminating`` until the cache's pods are gone, and
        while another replica holds the lease (kopf stopped this cache's daemon already, so
        deletion asks for the lease by itself)."""
        if self.handover is not None and not self.handover.enter(briefly=True):
            raise StillTerminating("waiting for the hand-over lease: another replica may still be writing")
        try:
            finalize(self.api, namespace, name)
        finally:
            if self.handover is not None:
                self.handover.leave()

    def hand_over(self, peering: str, identity: str, duration: float) -> None:
        """Start taking the replicas' lease whenever this replica acts for a cache."""
        if self.handover is None:
            self.handover = HandOver(self.api, peering, identity, duration, on_taken=self._lease_taken)

    def _enter(self, key: CacheKey) -> bool:
        """Whether a pass for ``key`` may write now; True obliges a ``handover.leave()``."""
        if self.handover is None:
            return True
        with self._guard:
            acting = key in self._acting
        if acting and self.handover.enter():
            return True
        log.info(
            "pass skipped: this replica does not act for the cache"
            if not acting
            else "pass skipped: waiting for the hand-over lease",
            extra={"cache": key[1], "namespace": key[0]},
        )
        return False

    def _lease_taken(self) -> None:
        with self._guard:
            keys = sorted(cast(set[CacheKey], self._acting))
        self._wake_all(keys)

    def _wake_all(self, keys: list[CacheKey]) -> None:
        """A full pass for each key, off the caller's thread (kopf's event loop, the lease keeper)."""
        for namespace, name in keys:
            threading.Thread(
                target=self._full_pass, args=(namespace, name), name=f"takeover-{name}", daemon=True
            ).start()

    def _full_pass(self, namespace: str, name: str) -> None:
        try:
            self.reconcile(namespace, name, apply=True)
        except ApiError as error:  # the resync timer runs the next one
            log.warning(
                "pass on taking over failed", extra={"cache": name, "namespace": namespace, "error": str(error)}
            )

    def caches_on_node(self, node: str, namespaces: list[str] | None = None) -> list[CacheKey]:
        """(namespace, name) of every cache with an engine pod bound to ``node`` as its latest pass
        saw them (engine_nodes.py; no API request); only in ``namespaces`` when given."""
        return [key for key in self.engine_nodes.caches_on(node) if not namespaces or key[0] in namespaces]

    def _woken(self, key: Hashable) -> None:
        """An alarm is due (or a probe heard an engine fall silent): one pass, as a pod event
        would run it — only while this replica acts for the cache."""
        self._wake(cast(CacheKey, key), "alarm")  # Alarms and probes keep our keys opaque

    def _heard(self, key: CacheKey) -> None:
        """A daemon's report changed (daemon_changes.py): one pass, as for an alarm."""
        self._wake(key, "daemon report changed")

    def _wake(self, key: CacheKey, why: str) -> None:
        namespace, name = key
        with self._guard:
            acting = key in self._acting
        if not acting:
            log.info(
                "wake-up dropped: this replica does not act for the cache",
                extra={"cache": name, "namespace": namespace},
            )
            return
        log.info(why, extra={"cache": name, "namespace": namespace})
        try:
            self.reconcile(namespace, name, apply=False)
        except ApiError as error:  # the next event or the resync timer will run a pass
            log.warning(f"pass after {why} failed", extra={"cache": name, "namespace": namespace, "error": str(error)})

    # --- one pass --------------------------------------------------------------------------------

    def _pass(self, namespace: str, name: str, apply: bool, lap: Callable[[str], None]) -> PassResult | None:
        key = (namespace, name)
        started = self.clock()
        done: list[Action] = []
        # A full pass (spec change, resync, taking over) LISTs what the watches hold: it also clears
        # the indexes of deletions a broken watch never told of (watch_index.py).
        snapshot = observe(
            self.api,
            namespace,
            name,
            self.nodes,
            self.engine_nodes,
            self._requests,
            watches=self.watches,
            watched=not apply,
            counted=self.metrics.read_by,
        )
        lap("observe")
        if snapshot is None or snapshot.body["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return None  # gone, or the finalizer owns it now: never recreate what it deletes
        cache = snapshot.cache
        if cache is None or snapshot.problems:
            # Nothing is created for an invalid spec; the condition says what to fix.
            status = invalid_status(
                snapshot.body["metadata"].get("generation"),
                snapshot.problems,
                self.clock(),
                snapshot.previous.conditions,
            )
            return self._report(snapshot, status, done, lap)
        refusal = pod_security_problem(snapshot.namespace, snapshot.namespace_labels, cache.spec.daemon.backend)
        if refusal is not None:
            # Pods already running stay (admission judges new pods only); none are added or replaced.
            status = invalid_status(
                snapshot.body["metadata"].get("generation"),
                [refusal],
                self.clock(),
                snapshot.previous.conditions,
                reason=POD_SECURITY_REASON,
            )
            return self._report(snapshot, status, done, lap)

        noticed = self.clock()
        unresponsive = self._watch_responsiveness(cache, snapshot)
        want = desired(cache)
        settles = self._switch_settles.get(key)
        plan = plan_pass(
            cache,
            snapshot,
            want,
            noticed,
            apply=apply,
            grace=timedelta(seconds=cache.spec.engine.failover.daemon_outage_grace_seconds),
            daemon_status=self.daemon_status,
            unresponsive=unresponsive,
            settling=settles is not None and noticed < settles,
        )
        lap("plan")
        # As the plan saw them: a gate it turns False in this pass is a failure seen now.
        self.sightings.saw(key, plan.view.engine_pods, snapshot.unready_nodes(), unresponsive, started, noticed)
        serving_before = snapshot.serving
        done.extend(plan.actions)
        outcome = execute(self.api, self.reporter, cache, snapshot, plan.actions, noticed, self._requests)
        lap("execute")
        if serving_before is not None and snapshot.serving != serving_before:
            settles = self._switch_settles.set(key, self.clock() + timedelta(seconds=SWITCH_SETTLE_SECONDS))
        # After the gates: a slow daemon endpoint must not delay an engine's readiness flip.
        reports = self.daemon_status.read(key, snapshot.daemon_pods)
        self.daemon_changes.watch(key, snapshot.daemon_pods, reports)
        lap("daemon-status")
        # A pass when the first kept gate's grace ends, or at the old generation's retirement
        # after a Service switch if that is sooner; at once when the reports just read change the
        # peers file the pass wrote (planned on the reports read before: plan/seeding.py).
        now = self.clock()
        behind = peers_behind(cache, snapshot, self.daemon_status.known(key))
        wakes = [
            w
            for w in (plan.gates_expire, settles if plan.engines.rollout.switching else None, now if behind else None)
            if w is not None
        ]
        self.alarms.set(key, min(wakes) if wakes else None, now)
        self.reporter.seed_fallbacks(snapshot.body, self.seed_fallbacks.new(key, snapshot.daemon_pods, reports))
        # As the pass leaves the DaemonSets: the pass that starts a change records its strategy
        # on the new DaemonSet it applies, which the snapshot it read does not hold yet.
        decision = strategy_decision(plan.view.daemonsets_of(want.daemon_hash))
        observed = Observed(
            snapshot.daemon_pods,
            snapshot.engine_pods,
            plan.engines.desired_nodes,
            daemon_reports=reports,
            stranded=plan.engines.stranded,
            holder_pods=snapshot.holder_pods if uses_gpu_holder(cache) else [],
            change=change_under_way(plan.engines.rollout, want, decision),
        )
        status = aggregate(cache, observed, self.clock(), snapshot.previous.conditions)
        rollout = self.reporter.rollout(
            snapshot.body,
            snapshot.previous,
            plan.engines.rollout,
            want,
            decision,
            snapshot.engine_pods,
        )
        starts = self.starts.new_starts(key, snapshot.engine_pods)
        engine_start = self.reporter.engine_starts(snapshot.body, starts, want.ready_deadline_s)
        # The one place the rooms' reports join the status: on a copy, typed (status_reports.py).
        status = completed(status, StatusReports(rollout, engine_start, outcome.failover, outcome.routing))
        return self._report(snapshot, status, done, lap)

    def _report(
        self, snapshot: Snapshot, status: WeightCacheStatus, done: list[Action], lap: Callable[[str], None]
    ) -> PassResult:
        """Writes the status the pass computed. Checked against the CRD's schema first: the
        models build it unchecked in places (model_copy), and one that does not fit fails the
        pass here, by name, instead of being pruned by the API server."""
        WeightCacheStatus.model_validate(status.wire())
        self.reporter.write_status(snapshot.body, status, snapshot.previous)
        self.metrics.cache_status(snapshot.namespace, snapshot.name, status)
        lap("status")
        return PassResult(tuple(done), status)

    def _watch_responsiveness(self, cache: WeightCache, snapshot: Snapshot) -> dict[str, datetime]:
        """Points the operator's own probes at the cache's Ready engines (none unless
        ``unresponsiveAfterMilliseconds`` is set) and returns those found silent. An engine group
        is probed through its leader, the one pod with a readiness endpoint (it answers for every
        rank), and fails over as a whole."""
        key = (snapshot.namespace, snapshot.name)
        timeout_ms = cache.spec.engine.failover.unresponsive_after_milliseconds
        urls: dict[str, str] = {}
        if timeout_ms:
            for raw in snapshot.engine_pods:
                pod = PodView(raw)
                if pod.ready and (url := probe_url(raw)):
                    urls[pod.name] = url
        self.responsiveness.watch(key, urls, (timeout_ms or 0) / 1000)
        return self.responsiveness.unresponsive(key)

    def _forget(self, key: CacheKey) -> None:
        self.memory.forget(key)
