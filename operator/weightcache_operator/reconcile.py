"""Level-based reconciliation of one WeightCache: read what exists, compare with what the pure
renderers say should exist, and close the gap. Every pass starts from the API server's state, so
a pass can be repeated, interrupted or run by another replica without harm.

The kopf handlers (handlers.py) only decide *when* a pass runs; everything here is plain,
synchronous code against ``KubeApi`` (run in kopf's handler threads).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from .alarms import Alarms
from .daemon_status import DaemonStatusReader
from .failover import Promotion, failover_status, plan_replica, unready_nodes
from .gates import DAEMON_UID_ANNOTATION, gate_wanted
from .kubeapi import STRATEGIC_MERGE, ApiError, KubeApi
from .objects import NodeView, Object, condition, pod_ready, spec_hash as _generation, stamp
from .metrics import OperatorMetrics
from .reasons import failure_events
from .render import (
    CACHE_LABEL,
    COMPONENT_LABEL,
    READY_GATE,
    REPLICA_LABEL,
    ROLE_LABEL,
    SPEC_HASH_LABEL,
    CacheRef,
    daemon_spec_hash,
    engine_pod,
    engine_service,
    engine_template_hash,
)
from .group_plan import Create, Delete, Failover, SetRole, group_progress, plan_groups
from .render.daemon import blue_green_name, daemon_daemonsets, slot_base
from .render.dra import claim_template, claim_template_name, daemon_claim, engine_claim_current, uses_dra
from .render.gpu_holder import (
    HOLDER_COMPONENT,
    blue_green_blocker,
    gpu_holder_daemonset,
    holder_name,
    reads_grant,
    stale_holder,
    uses_gpu_holder,
)
from .render.engine import Role
from .render.layout import GROUP_LABEL, MANAGED_BY, SLOT_LABEL, STRATEGY_ANNOTATION, STRATEGY_REASON_ANNOTATION
from .render.topology import assign_slots, selected
from .runner import PassRunner
from .responsiveness import ResponsivenessWatch, probe_url
from .rollout import Desired, Plan, Strategy, generation_strategy, plan, rollout_conditions, rollout_status
from .spec import GROUP, PLURAL, VERSION, FailoverStatus, WeightCache
from .status import Observed, aggregate, daemon_pod_current, invalid_status
from .validation import parse

log = logging.getLogger("weightcache_operator.reconcile")


def cache_path(namespace: str, name: str) -> str:
    return f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"


class StillTerminating(Exception):
    """Raised by ``finalize`` while pods it asked to stop still run on healthy nodes."""


class Reconciler:
    """Passes over caches; one at a time per cache, bursts of triggers coalesced into one rerun."""

    def __init__(self, api: KubeApi, clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
                 daemon_status: DaemonStatusReader | None = None, metrics: OperatorMetrics | None = None) -> None:
        self.api = api
        self.clock = clock
        self.daemon_status = daemon_status or DaemonStatusReader()
        self.metrics = metrics or OperatorMetrics()
        self._runner = PassRunner()
        self._guard = threading.Lock()
        self.alarms = Alarms(self._woken)
        """Wake-ups for decisions that change with time alone (a gate kept through a daemon outage)."""
        self.responsiveness = ResponsivenessWatch(self._woken)
        """The operator's own probes of Ready engines (``unresponsiveAfterMilliseconds``)."""
        self._acting: set[Hashable] = set()
        """Caches this replica acts for (handlers.acting): alarms and probes wake passes only there."""

    # --- entry points ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, apply: bool = True) -> str | None:
        """One pass for the cache; ``apply`` also server-side-applies DaemonSet and Service (on
        spec changes and the periodic resync; pod events skip it). Returns the phase written."""
        def one_pass(apply: bool) -> str | None:
            started, outcome = time.perf_counter(), "error"
            try:
                phase = self._pass(namespace, name, apply)
                outcome = "ok" if phase is not None else "gone"
                return phase
            finally:
                self.metrics.pass_done(namespace, name, outcome, time.perf_counter() - started)

        return self._runner.run((namespace, name), apply, one_pass)

    def acting(self, key: Hashable, on: bool) -> None:
        """Whether this replica acts for the cache ``key`` (kopf's daemon for it runs). Off: its
        alarms and engine probes stop, so a replica paused by peering runs no pass of its own."""
        with self._guard:
            if on:
                self._acting.add(key)
            else:
                self._acting.discard(key)
        namespace, name = key  # type: ignore[misc]
        log.info("acting for the cache" if on else "no longer acting for the cache",
                 extra={"cache": name, "namespace": namespace})  # fmt: skip
        if not on:
            self.alarms.cancel(key)
            self.responsiveness.forget(key)

    def _woken(self, key: Hashable) -> None:
        """An alarm is due (or a probe heard an engine fall silent): one pass, as a pod event
        would run it — only while this replica acts for the cache."""
        namespace, name = key  # type: ignore[misc]
        with self._guard:
            acting = key in self._acting
        if not acting:
            log.info("wake-up dropped: this replica does not act for the cache", extra={"cache": name, "namespace": namespace})
            return
        log.info("alarm", extra={"cache": name, "namespace": namespace})
        try:
            self.reconcile(namespace, name, apply=False)
        except ApiError as error:  # the next event or the resync timer will run a pass
            log.warning("pass after alarm failed", extra={"cache": name, "namespace": namespace, "error": str(error)})

    def finalize(self, namespace: str, name: str) -> None:
        """Deletes everything the cache owns and waits until its pods are gone (their processes,
        keeper arenas included, with them). Pods on a node that is gone or NotReady are deleted
        with grace 0: nobody will ever confirm their stop, and deletion must still complete."""
        ref_sel = f"{CACHE_LABEL}={name}"
        ns = f"/api/v1/namespaces/{namespace}"
        for ds in self.api.list(f"/apis/apps/v1/namespaces/{namespace}/daemonsets", ref_sel):
            self.api.delete(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{ds['metadata']['name']}",
                            propagation="Background")  # fmt: skip
        # gpuAccess dra only (a 404, ignored, otherwise); the claims made from it go with their pods.
        self.api.delete(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{name}-gpus")
        for svc in self.api.list(f"{ns}/services", ref_sel):
            self.api.delete(f"{ns}/services/{svc['metadata']['name']}")
        pods = self.api.list(f"{ns}/pods", ref_sel)
        healthy = self._ready_nodes()
        waiting = []
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node and node not in healthy:
                self.api.delete(f"{ns}/pods/{pod['metadata']['name']}", grace_seconds=0)
                continue
            if not pod["metadata"].get("deletionTimestamp"):
                self.api.delete(f"{ns}/pods/{pod['metadata']['name']}")
            waiting.append(pod["metadata"]["name"])
        if waiting:
            raise StillTerminating(f"waiting for {len(waiting)} pods to stop: {', '.join(sorted(waiting))}")

    def caches_on_node(self, node: str, namespaces: list[str] | None = None) -> list[tuple[str, str]]:
        """(namespace, name) of every cache with an engine pod bound to ``node``; only in
        ``namespaces`` when given (a namespaced install may not list pods cluster-wide)."""
        paths = [f"/api/v1/namespaces/{ns}/pods" for ns in namespaces or []] or ["/api/v1/pods"]
        found = [pod for path in paths
                 for pod in self.api.get(path, labelSelector=f"{COMPONENT_LABEL}=engine,{CACHE_LABEL}",
                                         fieldSelector=f"spec.nodeName={node}")["items"]]  # fmt: skip
        return sorted({(p["metadata"]["namespace"], p["metadata"]["labels"][CACHE_LABEL]) for p in found})

    # --- one pass --------------------------------------------------------------------------------

    def _pass(self, namespace: str, name: str, apply: bool) -> str | None:
        try:
            body = self.api.get(cache_path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                self._forget(namespace, name)
                return None
            raise
        if body["metadata"].get("deletionTimestamp"):
            self._forget(namespace, name)
            return None  # the finalizer owns it now; never recreate what it deletes
        cache, problems = parse(body)
        previous = (body.get("status") or {}).get("conditions") or []
        if cache is None or problems:
            # Nothing is created for an invalid spec; the condition says what to fix.
            status = invalid_status(body["metadata"].get("generation"), problems, self.clock(), previous)
            self._write_status(body, status)
            self.metrics.cache_status(namespace, name, status)
            return status["phase"]

        ns = f"/api/v1/namespaces/{namespace}"
        if apply:
            self._apply_daemons(cache)

        noticed = self.clock()
        spec_hash = daemon_spec_hash(cache)
        daemon_pods = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=daemon")
        ready_daemons = {p["spec"]["nodeName"]: p for p in daemon_pods
                         if p["spec"].get("nodeName") and daemon_pod_current(p, spec_hash)}  # fmt: skip
        engines = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=engine")
        unready = unready_nodes(self.api.list("/api/v1/nodes"))
        unresponsive = self._watch_responsiveness(cache, engines)
        grace = timedelta(seconds=cache.spec.engine.failover.daemon_outage_grace_seconds)
        # Gates first: a daemon that failed turns its engines' gate False in this very pass, and
        # the failover below sees it without waiting for the kubelet to drop their Ready.
        self._sync_gates((namespace, name), engines, daemon_pods, unready, grace)
        daemonsets = self.api.list(f"/apis/apps/v1/namespaces/{namespace}/daemonsets",
                                   f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=daemon")  # not the GPU holder's
        current_sets = [ds for ds in daemonsets if _generation(ds) == spec_hash]
        # A blue/green change's old side: DaemonSets of another generation next to the current one.
        old_sets = {ds["metadata"]["name"]: _generation(ds) for ds in daemonsets
                    if current_sets and _old_side(ds, _set_name(current_sets[0]), spec_hash)}  # fmt: skip
        desired = sum((ds.get("status") or {}).get("desiredNumberScheduled", 0) for ds in current_sets or daemonsets)
        want = _desired(cache)
        serving = self._serving_generation(cache)
        steps = plan(want, engines, daemon_pods, serving, self.clock(), (body.get("status") or {}).get("rollout"), desired,
                     old_sets)  # fmt: skip
        if cache.spec.parallelism.nodes > 1:
            # Engine groups roll through plan_groups; this only reports how far that got.
            steps = group_progress(want, engines, cache.spec.parallelism.nodes, self.clock(),
                                   (body.get("status") or {}).get("rollout"), serving, old_sets)  # fmt: skip
        self._roll(cache, steps, engines, ready_daemons, apply or serving != steps.serve_generation)
        if steps.promote or steps.retire:
            engines = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=engine")
        stranded, failover = self._scale_engines(body, cache, engines, ready_daemons, unready, noticed,
                                                 frozenset(steps.held), unresponsive, steps.serve_generation)  # fmt: skip
        engines = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=engine")
        self._sync_gates((namespace, name), engines, daemon_pods, unready, grace)

        # After the gates: a slow daemon endpoint must not delay an engine's readiness flip.
        reports = self.daemon_status.read((namespace, name), daemon_pods)
        holders = (self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}={HOLDER_COMPONENT}")
                   if uses_gpu_holder(cache) else [])  # fmt: skip
        observed = Observed(daemon_pods, engines, desired, daemon_reports=reports, stranded=stranded, holder_pods=holders)
        status = aggregate(cache, observed, self.clock(), previous)
        self._add_rollout(body, status, steps, want, _decision(current_sets), previous)
        if failover is not None:
            # The status is merge-patched: null out what this failover lacks (a PodGone has no
            # "from"), or the previous failover's values would survive next to this one's.
            status["lastFailover"] = {**dict.fromkeys(_FAILOVER_FIELDS), **failover}
        self._write_status(body, status)
        self.metrics.cache_status(namespace, name, status)
        return status["phase"]

    def _watch_responsiveness(self, cache: WeightCache, engines: list[Object]) -> dict[str, datetime]:
        """Points the operator's own probes at the cache's Ready engines (none unless
        ``unresponsiveAfterMilliseconds`` is set) and returns those found silent. Engine groups
        (``parallelism.nodes > 1``) are left to the kubelet: a group fails over as a whole."""
        ref = CacheRef.of(cache)
        timeout_ms = cache.spec.engine.failover.unresponsive_after_milliseconds
        urls: dict[str, str] = {}
        if timeout_ms and cache.spec.parallelism.nodes == 1:
            for pod in engines:
                if not pod["metadata"].get("deletionTimestamp") and pod_ready(pod) and (url := probe_url(pod)):
                    urls[pod["metadata"]["name"]] = url
        self.responsiveness.watch((ref.namespace, ref.name), urls, timeout_ms / 1000)
        return self.responsiveness.unresponsive((ref.namespace, ref.name))

    def _serving_generation(self, cache: WeightCache) -> str | None:
        """The generation the live Service selects; None when there is no Service (yet)."""
        ref = CacheRef.of(cache)
        try:
            live = self.api.get(f"/api/v1/namespaces/{ref.namespace}/services/{cache.spec.service.name or ref.name}")
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return ((live.get("spec") or {}).get("selector") or {}).get(SPEC_HASH_LABEL)

    def _roll(self, cache: WeightCache, steps: Plan, engines: list[Object], ready_daemons: dict[str, Object],
              apply_service: bool) -> None:  # fmt: skip
        """Carries out a rollout plan. The order is what keeps the Service whole: new actives are
        labelled first, then the Service is applied (switching generation when the plan says so),
        and only then are old pods deleted, each with its grace period so in-flight requests
        finish."""
        ref = CacheRef.of(cache)
        ns = f"/api/v1/namespaces/{ref.namespace}"
        for name in steps.promote:
            self._set_role(f"{ns}/pods", {"metadata": {"name": name, "labels": {}}}, "active")
            log.info("rollout promoted", extra={"pod": name})
        if apply_service:
            service = engine_service(cache, steps.serve_generation)
            self.api.apply(f"{ns}/services/{service['metadata']['name']}", service)
        for name in steps.retire:
            self._delete_pod(f"{ns}/pods", {"metadata": {"name": name}}, "rolled out")
        load = Counter(p["spec"].get("nodeName") for p in engines if not p["metadata"].get("deletionTimestamp"))
        for replica in steps.create:
            new = self._new_engine(cache, replica, "standby", ready_daemons, load) if ready_daemons else None
            if new is not None:
                self._create(f"{ns}/pods", new)
        if steps.replace_daemon:
            self._replace_stale_holder(cache, steps.replace_daemon)
            self.api.delete(f"{ns}/pods/{steps.replace_daemon}")
            log.info("replacing daemon", extra={"pod": steps.replace_daemon, "reason": "generation change"})
        for name in steps.retire_daemonsets:
            # Background: the garbage collector deletes its pods (keepers and arenas with them).
            self.api.delete(f"/apis/apps/v1/namespaces/{ref.namespace}/daemonsets/{name}", propagation="Background")
            log.info("deleted daemonset", extra={"daemonset": name, "reason": "blue/green: old generation drained"})

    def _add_rollout(self, body: Object, status: dict[str, Any], steps: Plan, want: Desired,
                     decision: tuple[Strategy, str] | None, previous: list[dict[str, Any]]) -> None:  # fmt: skip
        """Adds ``status.rollout`` and the rollout conditions; posts an Event when a rollout
        starts, stalls or completes. ``decision``: how the generation change was decided (the
        current DaemonSet's annotations)."""
        now = self.clock()
        before = (body.get("status") or {}).get("rollout")
        rollout = rollout_status(steps, want, now, before)
        if rollout is not None:
            status["rollout"] = rollout
        strategy = decision if steps.mode == "Generation" else None
        extra = rollout_conditions(steps, strategy, now, previous, body["metadata"].get("generation"))
        replaced = {c["type"] for c in extra}
        status["conditions"] = [c for c in status["conditions"] if c["type"] not in replaced] + extra
        if rollout is not None and (before or {}).get("phase") != rollout["phase"]:
            kind = "Warning" if rollout["phase"] == "Stalled" else "Normal"
            message = rollout.get("message") or f"{rollout.get('mode')} rollout: {rollout.get('currentStep')}"
            if strategy is not None and rollout["phase"] == "Progressing":
                message += f"; {strategy[0]}: {strategy[1]}"
            self._event(body, kind, f"Rollout{rollout['phase']}", message)

    def _forget(self, namespace: str, name: str) -> None:
        self.daemon_status.forget((namespace, name))
        self.alarms.cancel((namespace, name))
        self.responsiveness.forget((namespace, name))
        self.metrics.cache_status(namespace, name, None)

    def _scale_engines(self, body: Object, cache: WeightCache, pods: list[Object], ready_daemons: dict[str, Object],
                       unready: dict[str, datetime | None], noticed: datetime,
                       held: frozenset[str] = frozenset(),
                       unresponsive: Mapping[str, datetime] | None = None,
                       serving: str | None = None) -> tuple[list[str], dict[str, Any] | None]:  # fmt: skip
        """Exactly ``replicas`` actives and ``standbysPerReplica`` standbys per replica; the
        per-replica decisions (failover included) are failover.plan_replica's. New pods go only to
        nodes whose daemon is ready; while there is none, nothing is created. Returns why a
        replica is left without a Ready engine after a failure (for the Degraded condition) and
        the failover done in this pass, if any (for status.lastFailover).

        ``ready_daemons``: node → its Ready daemon pod of the current spec. With
        ``parallelism.nodes > 1`` engines are groups of pods, planned by ``plan_groups``.
        ``held``: a rollout's surge pods (rollout.py), neither counted nor trimmed here.
        ``unresponsive``: engines the operator's own probes found silent (responsiveness.py).
        ``serving``: the generation the Service selects after this pass (engine groups keep an
        active of it until the Service switches)."""
        pods = [p for p in pods if p["metadata"]["name"] not in held]
        ref = CacheRef.of(cache)
        ns = f"/api/v1/namespaces/{ref.namespace}/pods"
        if cache.spec.parallelism.nodes > 1:
            return [], self._scale_groups(body, cache, pods, ready_daemons, unready, noticed, serving)
        spec = cache.spec.engine
        spec_hash = daemon_spec_hash(cache)
        stranded: list[str] = []
        failover = None
        gone: set[str] = set()
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            replica = (pod["metadata"].get("labels") or {}).get(REPLICA_LABEL, "")
            node = pod["spec"].get("nodeName")
            if not replica.isdigit() or int(replica) >= spec.replicas:
                self._delete_pod(ns, pod, "scaled down" if replica.isdigit() else "no replica label")
            elif GROUP_LABEL in (pod["metadata"].get("labels") or {}):
                self._delete_pod(ns, pod, "part of a multi-node engine; parallelism.nodes is 1 now")
            elif node in ready_daemons and not engine_claim_current(pod, ready_daemons[node]):
                self._delete_pod(ns, pod, "its node's daemon was replaced: the engine's ResourceClaim is stale")
            else:
                continue
            gone.add(pod["metadata"]["name"])
        kept = [p for p in pods if p["metadata"]["name"] not in gone]
        ready_nodes = sorted(ready_daemons)
        load = Counter(p["spec"].get("nodeName") for p in kept if not p["metadata"].get("deletionTimestamp"))
        for replica in range(spec.replicas):
            mine = [p for p in kept if p["metadata"]["labels"].get(REPLICA_LABEL) == str(replica)]
            plan = plan_replica(replica, mine, spec.standbys_per_replica, spec_hash, unready, unresponsive)
            if plan.promotion is not None:
                failover = self._promote(body, plan.promotion, noticed) or failover
            for pod in plan.demote:
                self._set_role(ns, pod, "standby")
            for pod, why in plan.delete:
                self._delete_pod(ns, pod, why)
            if plan.stranded:
                stranded.append(plan.stranded)
            if not ready_nodes:
                continue
            wanted: list[Role] = ["active"] if plan.create_active else []
            wanted += ["standby"] * plan.create_standbys
            for role in wanted:
                new = self._new_engine(cache, replica, role, ready_daemons, load)
                if new is not None:
                    self._create(ns, new)
        return stranded, failover

    def _promote(self, body: Object, promotion: Promotion, noticed: datetime) -> dict[str, Any] | None:
        """Relabels the standby to active (the Service follows the label), then records the
        failover: the ``status.lastFailover`` entry it returns, an Event and metrics."""
        namespace = body["metadata"]["namespace"]
        self._set_role(f"/api/v1/namespaces/{namespace}/pods", promotion.promoted, "active")
        return self._record_failover(body, promotion, noticed)

    def _record_failover(self, body: Object, promotion: Promotion, noticed: datetime) -> dict[str, Any] | None:
        """The ``status.lastFailover`` entry of a promotion just patched, its Event and metrics;
        None when it was no failover (an active that never got Ready swapped for a Ready one)."""
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        record = failover_status(promotion, noticed, self.clock())
        log.info("promoted standby", extra={"cache": name, "namespace": namespace, **record})
        if promotion.failure is None:
            return None  # an active that never got Ready swapped for a Ready standby: not a failover
        self.metrics.failover(namespace, name, promotion.failure.signal, record.get("detectionMs"), record["promotionMs"])
        self._event(body, "Warning", "Failover",
                    f"replica {promotion.replica}: {record.get('from', 'no active')} failed ({promotion.failure.detail}); "
                    f"promoted {record['to']} in {record['promotionMs']} ms")  # fmt: skip
        return record

    def _new_engine(self, cache: WeightCache, replica: int, role: Role, ready_daemons: dict[str, Object],
                    load: Counter[str | None]) -> Object | None:  # fmt: skip
        """An engine pod pinned to nodes with Ready daemons; with ``gpuAccess: dra`` to one such
        node (the one running fewest engines), sharing that daemon's ResourceClaim (None while no
        Ready daemon has its claim yet)."""
        if not uses_dra(cache):
            return engine_pod(cache, replica, role, sorted(ready_daemons))
        claims = {n: c for n, d in ready_daemons.items() if (c := daemon_claim(d))}
        if not claims:
            return None
        node = min(sorted(claims), key=lambda n: load[n])
        load[node] += 1  # counts towards the next pick in this pass
        return engine_pod(cache, replica, role, [node], claim=claims[node])

    def _scale_groups(self, body: Object, cache: WeightCache, pods: list[Object], ready_daemons: dict[str, Object],
                      unready: dict[str, datetime | None], noticed: datetime,
                      serving: str | None) -> dict[str, Any] | None:  # fmt: skip
        """Carries out ``plan_groups``: engines spanning ``parallelism.nodes`` nodes. Returns the
        failover done in this pass, if any (for status.lastFailover)."""
        ns = f"/api/v1/namespaces/{CacheRef.of(cache).namespace}/pods"
        by_slot: dict[int, dict[str, Object]] = {}
        for node, daemon in ready_daemons.items():
            slot = (daemon["metadata"].get("labels") or {}).get(SLOT_LABEL, "")
            if slot.isdigit():
                by_slot.setdefault(int(slot), {})[node] = daemon
        failover = None
        actions = plan_groups(cache, pods, by_slot, lambda: secrets.token_hex(3), unready, serving)
        # The order that keeps the Service serving, as with single-node engines: relabel (promote)
        # first, then record, then delete failed or retired groups, then create.
        order = (SetRole, Failover, Delete, Create)
        for action in sorted(actions, key=lambda a: order.index(type(a))):
            if isinstance(action, Failover):  # after its relabels: the Service already follows
                failover = self._record_failover(body, action.promotion, noticed) or failover
            elif isinstance(action, Create):
                self._create(ns, action.pod)
            elif isinstance(action, Delete):
                self._delete_pod(ns, {"metadata": {"name": action.name}}, action.why)
            elif isinstance(action, SetRole):
                self._set_role(ns, {"metadata": {"name": action.name, "labels": {}}}, action.role)
        return failover

    def _apply_daemons(self, cache: WeightCache) -> None:
        """Server-side applies the daemon DaemonSets (one, or one per node slot with
        ``parallelism.nodes > 1``) and deletes this cache's DaemonSets that are no longer wanted;
        with ``gpuAccess: dra`` first the ResourceClaimTemplate their pods claim GPUs from, on
        other GPU backends first the GPU holder DaemonSet that books their GPUs (deleted once no
        daemon DaemonSet reads its grant)."""
        ref = CacheRef.of(cache)
        base = f"/apis/apps/v1/namespaces/{ref.namespace}/daemonsets"
        slots: list[list[str]] = []
        if cache.spec.parallelism.nodes > 1:
            nodes = [n["metadata"]["name"] for n in self.api.list("/api/v1/nodes") if selected(cache.spec.placement, n)]
            slots = assign_slots(nodes, cache.spec.parallelism.nodes).slots
        if uses_dra(cache):
            templates = f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaimtemplates"
            self.api.apply(f"{templates}/{claim_template_name(ref)}", claim_template(cache))
        listed = self.api.list(base, f"{CACHE_LABEL}={ref.name}")
        existing = [ds for ds in listed if ds["metadata"]["labels"].get(COMPONENT_LABEL) == "daemon"]
        grouped = cache.spec.parallelism.nodes > 1
        mine = [ds for ds in existing if (SLOT_LABEL in ds["metadata"]["labels"]) == grouped]
        name, annotations = self._daemonset_for_generation(cache, mine)
        wanted = daemon_daemonsets(cache, slots, name, annotations)
        holder = gpu_holder_daemonset(cache, slots)
        if holder is not None:
            # Before the daemons: they wait for its grant.
            self.api.apply(f"{base}/{holder['metadata']['name']}", holder)
        for ds in wanted:
            self.api.apply(f"{base}/{ds['metadata']['name']}", ds)
        names = {ds["metadata"]["name"] for ds in wanted}
        kept = list(wanted)
        for ds in existing:
            if ds["metadata"]["name"] in names:
                continue
            if ds in mine and _old_side(ds, name, daemon_spec_hash(cache)):
                kept.append(ds)
                continue  # a blue/green change's old side: the rollout deletes it once drained
            self.api.delete(f"{base}/{ds['metadata']['name']}", propagation="Background")
            log.info("deleted daemonset", extra={"daemonset": ds["metadata"]["name"], "reason": "layout changed"})
        holder_live = any(ds["metadata"]["labels"].get(COMPONENT_LABEL) == HOLDER_COMPONENT for ds in listed)
        if holder is None and holder_live and not any(reads_grant(ds) for ds in kept):
            # No GPUs booked through a holder any more (cpu-shm, dra), and no daemon left on them.
            self.api.delete(f"{base}/{holder_name(ref)}", propagation="Background")
            log.info("deleted daemonset", extra={"daemonset": holder_name(ref), "reason": "no GPU holder needed"})

    def _daemonset_for_generation(self, cache: WeightCache, daemonsets: list[Object]) -> tuple[str, dict[str, str]]:
        """Which DaemonSet holds the wanted generation — with ``nodes > 1``, the base name of its
        set of slot DaemonSets (``<base>-<slot>``) — and how its change was decided. The decision
        is taken once, when no DaemonSet holds the wanted generation yet: blue/green starts a
        second DaemonSet or set (``blue_green_name``), node by node updates the newest in place.
        It is recorded on the DaemonSets, so later passes (and a restarted operator) carry on the
        same way even as the daemons' free memory changes under them."""
        spec_hash = daemon_spec_hash(cache)
        current = next((ds for ds in daemonsets if _generation(ds) == spec_hash), None)
        if current is not None:
            kept = {k: v for k, v in (current["metadata"].get("annotations") or {}).items()
                    if k in (STRATEGY_ANNOTATION, STRATEGY_REASON_ANNOTATION)}  # fmt: skip
            return _set_name(current), kept
        if not daemonsets:
            return CacheRef.of(cache).daemon_name, {}
        strategy, why = self._choose_strategy(cache, daemonsets)
        newest = max(daemonsets, key=lambda ds: (ds["metadata"].get("creationTimestamp", ""), ds["metadata"]["name"]))
        name = blue_green_name(cache) if strategy == "BlueGreen" else _set_name(newest)
        log.info("generation change", extra={"cache": CacheRef.of(cache).name, "strategy": strategy, "reason": why,
                                              "daemonset": name})  # fmt: skip
        return name, {STRATEGY_ANNOTATION: strategy, STRATEGY_REASON_ANNOTATION: why[:1024]}

    def _choose_strategy(self, cache: WeightCache, daemonsets: list[Object]) -> tuple[Strategy, str]:
        """``generation_strategy`` over fresh reports of the serving daemons, once the state is
        clean enough for a second generation: DaemonSets of one generation whose pods all run it
        (a change still under way is finished node by node, so no node ever runs two daemons of
        one generation on one socket directory)."""
        ref = CacheRef.of(cache)
        pods = self.api.list(f"/api/v1/namespaces/{ref.namespace}/pods", f"{CACHE_LABEL}={ref.name},{COMPONENT_LABEL}=daemon")
        generations = {_generation(ds) for ds in daemonsets}
        if len(generations) > 1 or any(_generation(p) not in generations for p in pods):
            return "NodeByNode", "a previous generation change is still under way"
        reports = self.daemon_status.read((ref.namespace, ref.name), pods, refresh=True)
        holders = self.api.list(f"/api/v1/namespaces/{ref.namespace}/pods",
                                f"{CACHE_LABEL}={ref.name},{COMPONENT_LABEL}={HOLDER_COMPONENT}")  # fmt: skip
        return generation_strategy(cache.spec.daemon.generation_change, cache.spec.daemon.backend, reports,
                                   gpu_access=cache.spec.engine.gpu_access,
                                   gpus_shared=blue_green_blocker(cache, pods, holders))  # fmt: skip

    def _replace_stale_holder(self, cache: WeightCache, daemon_pod: str) -> None:
        """Node by node with a new GPU count: deletes the GPU holder pod of the node whose daemon
        is being replaced, if it books another number of GPUs (its DaemonSet is OnDelete), so the
        new daemon waits for a holder with the new count. Only here: the node's engines are
        drained and its daemon is going, so nothing uses the GPUs it un-books for a moment."""
        if not uses_gpu_holder(cache):
            return
        ref = CacheRef.of(cache)
        ns = f"/api/v1/namespaces/{ref.namespace}/pods"
        try:
            node = self.api.get(f"{ns}/{daemon_pod}")["spec"].get("nodeName")
        except ApiError as error:
            if error.status != 404:
                raise
            return
        for pod in self.api.list(ns, f"{CACHE_LABEL}={ref.name},{COMPONENT_LABEL}={HOLDER_COMPONENT}"):
            if node and pod["spec"].get("nodeName") == node and stale_holder(cache, pod):
                self.api.delete(f"{ns}/{pod['metadata']['name']}")
                log.info("replacing gpu holder", extra={"pod": pod["metadata"]["name"], "reason": "GPUs per node changed"})

    def _sync_gates(self, key: tuple[str, str], engines: list[Object], daemon_pods: list[Object],
                    unready: dict[str, datetime | None], grace: timedelta) -> None:  # fmt: skip
        """Sets ``weightcache.io/daemon-ready`` on each engine pod as ``gates.gate_wanted`` decides
        (granted only on a Ready daemon of the engine's generation; kept through a daemon outage
        shorter than ``grace``), records the daemon pod it was granted on, and asks for one pass
        when the first kept gate's grace ends (none when no gate is kept). Patches only what differs."""
        namespace = key[0]
        now = self.clock()
        by_node: dict[str, list[Object]] = {}
        for daemon in daemon_pods:
            if daemon["spec"].get("nodeName"):
                by_node.setdefault(daemon["spec"]["nodeName"], []).append(daemon)
        expiries: list[datetime] = []
        for pod in engines:
            node = pod["spec"].get("nodeName")
            if not node or pod["metadata"].get("deletionTimestamp"):
                continue
            decision = gate_wanted(pod, by_node.get(node, []), now, grace, node_ready=node not in unready)
            if decision.expires is not None:
                expiries.append(decision.expires)
            path = f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}"
            want = "True" if decision.ready else "False"
            have = next((c for c in pod["status"].get("conditions") or [] if c["type"] == READY_GATE), None)
            try:
                annotations = pod["metadata"].get("annotations") or {}
                if decision.daemon_uid and annotations.get(DAEMON_UID_ANNOTATION) != decision.daemon_uid:
                    # Before the gate: a gate is never True without the daemon pod it relies on named.
                    self.api.patch(path, {"metadata": {"annotations": {DAEMON_UID_ANNOTATION: decision.daemon_uid}}})
                    pod["metadata"]["annotations"] = {**annotations, DAEMON_UID_ANNOTATION: decision.daemon_uid}
                if have is not None and (have.get("status"), have.get("reason")) == (want, decision.reason):
                    continue
                gate = condition(READY_GATE, want, decision.reason, decision.message, now, [have] if have else [])
                self.api.patch(f"{path}/status", {"status": {"conditions": [gate]}}, STRATEGIC_MERGE)
                others = [c for c in pod["status"].get("conditions") or [] if c["type"] != READY_GATE]
                pod["status"]["conditions"] = [*others, gate]  # what the rest of the pass sees
                log.info("readiness gate", extra={"pod": pod["metadata"]["name"], "node": node, "status": want,
                                                  "reason": decision.reason})  # fmt: skip
            except ApiError as error:
                if error.status != 404:
                    raise
        self.alarms.set(key, min(expiries, default=None), now)

    # --- small steps -----------------------------------------------------------------------------

    def _create(self, ns_pods: str, pod: Object) -> None:
        created = self.api.create(ns_pods, pod)
        log.info("created engine", extra={"pod": created["metadata"]["name"],
                                          "role": pod["metadata"]["labels"][ROLE_LABEL]})  # fmt: skip

    def _delete_pod(self, ns_pods: str, pod: Object, why: str) -> None:
        self.api.delete(f"{ns_pods}/{pod['metadata']['name']}")
        log.info("deleted engine", extra={"pod": pod["metadata"]["name"], "reason": why})

    def _set_role(self, ns_pods: str, pod: Object, role: str) -> None:
        self.api.patch(f"{ns_pods}/{pod['metadata']['name']}", {"metadata": {"labels": {ROLE_LABEL: role}}})
        pod["metadata"]["labels"][ROLE_LABEL] = role

    def _ready_nodes(self) -> set[str]:
        return {n.name for n in map(NodeView, self.api.list("/api/v1/nodes")) if n.ready}

    def _write_status(self, body: Object, status: dict[str, Any]) -> None:
        meta = body["metadata"]
        old = body.get("status") or {}
        if old.get("phase") != status.get("phase"):
            self._event(body, "Warning" if status["phase"] in ("Failed", "Degraded") else "Normal",
                        f"Phase{status['phase']}", _phase_message(status))  # fmt: skip
            log.info("phase", extra={"cache": meta["name"], "namespace": meta["namespace"], "phase": status["phase"]})
        for reason, message in failure_events(old.get("conditions") or [], status.get("conditions") or []):
            self._event(body, "Warning", reason, message)
        if all(old.get(k) == v for k, v in status.items()):
            return
        try:
            self.api.patch(cache_path(meta["namespace"], meta["name"]) + "/status", {"status": status})
        except ApiError as error:
            if error.status != 404:
                raise

    def _event(self, body: Object, kind: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        now = stamp(self.clock())
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"], "labels": dict(MANAGED_BY)},
            "involvedObject": {"apiVersion": body["apiVersion"], "kind": body["kind"], "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"]},
            "type": kind, "reason": reason, "message": message[:1024],
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "source": {"component": "weightcache-operator"},
        }  # fmt: skip
        try:
            self.api.create(f"/api/v1/namespaces/{meta['namespace']}/events", event)
        except ApiError as error:  # an event is a courtesy; never fail a pass for it
            log.warning("event not posted", extra={"error": str(error)})


_FAILOVER_FIELDS = [field.alias or name for name, field in FailoverStatus.model_fields.items()]


def _desired(cache: WeightCache) -> Desired:
    engine = cache.spec.engine
    return Desired(engine_hash=engine_template_hash(cache), generation=daemon_spec_hash(cache),
                   replicas=engine.replicas, standbys=engine.standbys_per_replica,
                   ready_deadline_s=engine.rollout.ready_deadline_seconds)  # fmt: skip


def _set_name(daemonset: Object) -> str:
    """What names a generation's daemons: the DaemonSet's name, or a slot DaemonSet's base."""
    return slot_base(daemonset) if SLOT_LABEL in daemonset["metadata"]["labels"] else str(daemonset["metadata"]["name"])


def _old_side(daemonset: Object, wanted: str, spec_hash: str) -> bool:
    """A DaemonSet of another generation than ``spec_hash`` that a blue/green change left next
    to the wanted one (``wanted``: its ``_set_name``): kept until drained."""
    return _generation(daemonset) != spec_hash and _set_name(daemonset) != wanted


def _decision(current_sets: list[Object]) -> tuple[Strategy, str] | None:
    """How the change to the current generation was decided, as recorded on its DaemonSet."""
    for ds in current_sets:
        annotations = ds["metadata"].get("annotations") or {}
        if annotations.get(STRATEGY_ANNOTATION) in ("BlueGreen", "NodeByNode"):
            return annotations[STRATEGY_ANNOTATION], annotations.get(STRATEGY_REASON_ANNOTATION, "")  # type: ignore[return-value]
    return None


def _phase_message(status: dict[str, Any]) -> str:
    degraded = next((c for c in status["conditions"] if c["type"] == "Degraded"), None)
    if degraded and degraded["status"] == "True":
        return degraded["message"]
    return f"nodes ready {status.get('readyNodes')}, active {status.get('activeEngines')}, standby {status.get('standbyEngines')}"

