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
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .daemon_status import DaemonStatusReader
from .kubeapi import STRATEGIC_MERGE, ApiError, KubeApi, Object
from .metrics import OperatorMetrics
from .render import (
    CACHE_LABEL,
    COMPONENT_LABEL,
    READY_GATE,
    REPLICA_LABEL,
    ROLE_LABEL,
    CacheRef,
    daemon_spec_hash,
    engine_pod,
    engine_service,
)
from .group_plan import Create, Delete, SetRole, plan_groups
from .render.daemon import daemon_daemonsets
from .render.dra import claim_template, claim_template_name, daemon_claim, engine_claim_current, uses_dra
from .render.engine import Role
from .render.layout import GROUP_LABEL, MANAGED_BY, SLOT_LABEL
from .render.topology import assign_slots, selected
from .spec import GROUP, PLURAL, VERSION, WeightCache
from .status import Observed, aggregate, daemon_pod_current, invalid_status, pod_ready
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
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._dirty: dict[tuple[str, str], bool] = {}
        self._guard = threading.Lock()

    # --- entry points ----------------------------------------------------------------------------

    def reconcile(self, namespace: str, name: str, apply: bool = True) -> str | None:
        """One pass for the cache; ``apply`` also server-side-applies DaemonSet and Service (on
        spec changes and the periodic resync; pod events skip it). Returns the phase written."""
        key = (namespace, name)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        if not lock.acquire(blocking=apply):
            self._dirty[key] = True  # the running pass will go round once more
            return None
        try:
            phase = None
            while True:
                self._dirty[key] = False
                started, outcome = time.perf_counter(), "error"
                try:
                    phase = self._pass(namespace, name, apply)
                    outcome = "ok" if phase is not None else "gone"
                finally:
                    self.metrics.pass_done(namespace, name, outcome, time.perf_counter() - started)
                if not self._dirty.get(key):
                    return phase
        finally:
            lock.release()

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
            service = engine_service(cache)
            self.api.apply(f"{ns}/services/{service['metadata']['name']}", service)

        spec_hash = daemon_spec_hash(cache)
        daemon_pods = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=daemon")
        ready_daemons = {p["spec"]["nodeName"]: p for p in daemon_pods
                         if p["spec"].get("nodeName") and daemon_pod_current(p, spec_hash)}  # fmt: skip
        engines = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=engine")
        self._scale_engines(cache, engines, ready_daemons)
        engines = self.api.list(f"{ns}/pods", f"{CACHE_LABEL}={name},{COMPONENT_LABEL}=engine")
        self._sync_gates(namespace, engines, ready_daemons)

        daemonsets = self.api.list(f"/apis/apps/v1/namespaces/{namespace}/daemonsets", f"{CACHE_LABEL}={name}")
        desired = sum((ds.get("status") or {}).get("desiredNumberScheduled", 0) for ds in daemonsets)
        # After the gates: a slow daemon endpoint must not delay an engine's readiness flip.
        reports = self.daemon_status.read((namespace, name), daemon_pods)
        observed = Observed(daemon_pods, engines, desired, daemon_reports=reports)
        status = aggregate(cache, observed, self.clock(), previous)
        self._write_status(body, status)
        self.metrics.cache_status(namespace, name, status)
        return status["phase"]

    def _forget(self, namespace: str, name: str) -> None:
        self.daemon_status.forget((namespace, name))
        self.metrics.cache_status(namespace, name, None)

    def _scale_engines(self, cache: WeightCache, pods: list[Object], ready_daemons: dict[str, Object]) -> None:
        """Exactly ``replicas`` actives and ``standbysPerReplica`` standbys per replica. A replica
        without an active engine, or whose active is not Ready while a standby is, promotes a
        standby (a Ready one first) rather than waiting for a new pod: the standby has the
        weights mapped already. New pods go only to nodes whose
        daemon is ready; while there is none, nothing is created.

        ``ready_daemons``: node → its Ready daemon pod of the current spec. With
        ``parallelism.nodes > 1`` engines are groups of pods, planned by ``plan_groups``."""
        ref = CacheRef.of(cache)
        ns = f"/api/v1/namespaces/{ref.namespace}/pods"
        if cache.spec.parallelism.nodes > 1:
            self._scale_groups(cache, pods, ready_daemons)
            return
        spec = cache.spec.engine
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        for pod in live:
            replica = (pod["metadata"].get("labels") or {}).get(REPLICA_LABEL, "")
            node = pod["spec"].get("nodeName")
            if not replica.isdigit() or int(replica) >= spec.replicas or pod["status"].get("phase") in ("Failed", "Succeeded"):
                self._delete_pod(ns, pod, "scaled down" if replica.isdigit() else "no replica label")
            elif GROUP_LABEL in (pod["metadata"].get("labels") or {}):
                self._delete_pod(ns, pod, "part of a multi-node engine; parallelism.nodes is 1 now")
            elif node in ready_daemons and not engine_claim_current(pod, ready_daemons[node]):
                self._delete_pod(ns, pod, "its node's daemon was replaced: the engine's ResourceClaim is stale")
            else:
                continue
            pod["metadata"]["deletionTimestamp"] = "deleted by this pass"
        live = [p for p in live if not p["metadata"].get("deletionTimestamp")]
        ready_nodes = sorted(ready_daemons)
        load = Counter(p["spec"].get("nodeName") for p in live)
        for replica in range(spec.replicas):
            mine = [p for p in live if p["metadata"]["labels"].get(REPLICA_LABEL) == str(replica)
                    and p["status"].get("phase") not in ("Failed", "Succeeded")]  # fmt: skip
            mine.sort(key=lambda p: (not pod_ready(p), p["metadata"]["creationTimestamp"], p["metadata"]["name"]))
            actives = [p for p in mine if p["metadata"]["labels"].get(ROLE_LABEL) == "active"]
            standbys = [p for p in mine if p["metadata"]["labels"].get(ROLE_LABEL) != "active"]
            for extra in actives[1:]:
                self._set_role(ns, extra, "standby")
                standbys.append(extra)
            if not actives and standbys:
                promoted = standbys.pop(0)
                self._set_role(ns, promoted, "active")
                log.info("promoted standby", extra={"pod": promoted["metadata"]["name"], "replica": replica})
                actives = [promoted]
            elif actives and not pod_ready(actives[0]) and standbys and pod_ready(standbys[0]):
                # Failover: the active engine died, fails readiness or lost its node; a Ready
                # standby takes the Service's traffic and the old active waits as a standby.
                promoted, demoted = standbys.pop(0), actives[0]
                self._set_role(ns, promoted, "active")
                self._set_role(ns, demoted, "standby")
                log.info("failover", extra={"replica": replica, "active": promoted["metadata"]["name"],
                                            "demoted": demoted["metadata"]["name"]})  # fmt: skip
                actives, standbys = [promoted], [*standbys, demoted]
            if not ready_nodes:
                continue
            wanted: list[Role] = ["active"] if not actives else []
            wanted += ["standby"] * (spec.standbys_per_replica - len(standbys))
            for role in wanted:
                pod = self._new_engine(cache, replica, role, ready_daemons, load)
                if pod is not None:
                    self._create(ns, pod)
            for extra in standbys[spec.standbys_per_replica:][::-1]:
                self._delete_pod(ns, extra, "too many standbys")

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

    def _scale_groups(self, cache: WeightCache, pods: list[Object], ready_daemons: dict[str, Object]) -> None:
        """Carries out ``plan_groups``: engines spanning ``parallelism.nodes`` nodes."""
        ns = f"/api/v1/namespaces/{CacheRef.of(cache).namespace}/pods"
        by_slot: dict[int, dict[str, Object]] = {}
        for node, daemon in ready_daemons.items():
            slot = (daemon["metadata"].get("labels") or {}).get(SLOT_LABEL, "")
            if slot.isdigit():
                by_slot.setdefault(int(slot), {})[node] = daemon
        for action in plan_groups(cache, pods, by_slot, lambda: secrets.token_hex(3)):
            if isinstance(action, Create):
                self._create(ns, action.pod)
            elif isinstance(action, Delete):
                self._delete_pod(ns, {"metadata": {"name": action.name}}, action.why)
            elif isinstance(action, SetRole):
                self._set_role(ns, {"metadata": {"name": action.name, "labels": {}}}, action.role)

    def _apply_daemons(self, cache: WeightCache) -> None:
        """Server-side applies the daemon DaemonSets (one, or one per node slot with
        ``parallelism.nodes > 1``) and deletes this cache's DaemonSets that are no longer wanted;
        with ``gpuAccess: dra`` first the ResourceClaimTemplate their pods claim GPUs from."""
        ref = CacheRef.of(cache)
        base = f"/apis/apps/v1/namespaces/{ref.namespace}/daemonsets"
        slots: list[list[str]] = []
        if cache.spec.parallelism.nodes > 1:
            nodes = [n["metadata"]["name"] for n in self.api.list("/api/v1/nodes") if selected(cache.spec.placement, n)]
            slots = assign_slots(nodes, cache.spec.parallelism.nodes).slots
        if uses_dra(cache):
            templates = f"/apis/resource.k8s.io/v1/namespaces/{ref.namespace}/resourceclaimtemplates"
            self.api.apply(f"{templates}/{claim_template_name(ref)}", claim_template(cache))
        wanted = daemon_daemonsets(cache, slots)
        for ds in wanted:
            self.api.apply(f"{base}/{ds['metadata']['name']}", ds)
        names = {ds["metadata"]["name"] for ds in wanted}
        for ds in self.api.list(base, f"{CACHE_LABEL}={ref.name},{COMPONENT_LABEL}=daemon"):
            if ds["metadata"]["name"] not in names:
                self.api.delete(f"{base}/{ds['metadata']['name']}", propagation="Background")
                log.info("deleted daemonset", extra={"daemonset": ds["metadata"]["name"], "reason": "layout changed"})

    def _sync_gates(self, namespace: str, engines: list[Object], ready_daemons: dict[str, Object]) -> None:
        """Sets ``weightcache.io/daemon-ready`` on each engine pod to whether its node's daemon is
        Ready with the expected spec hash (and, with ``gpuAccess: dra``, is the daemon whose
        ResourceClaim the engine shares); patches only what differs."""
        for pod in engines:
            node = pod["spec"].get("nodeName")
            if not node or pod["metadata"].get("deletionTimestamp"):
                continue
            current = node in ready_daemons and engine_claim_current(pod, ready_daemons[node])
            want = "True" if current else "False"
            have = next((c.get("status") for c in pod["status"].get("conditions") or [] if c["type"] == READY_GATE), None)
            if have == want:
                continue
            condition = {
                "type": READY_GATE,
                "status": want,
                "reason": "DaemonReady" if want == "True" else "DaemonNotReady",
                "message": f"daemon on {node} " + ("is ready with the expected spec" if want == "True" else "is not ready"),
                "lastTransitionTime": _stamp(self.clock()),
            }
            try:
                self.api.patch(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/status",
                               {"status": {"conditions": [condition]}}, STRATEGIC_MERGE)  # fmt: skip
                log.info("readiness gate", extra={"pod": pod["metadata"]["name"], "node": node, "status": want})
            except ApiError as error:
                if error.status != 404:
                    raise

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
        nodes = self.api.list("/api/v1/nodes")
        return {
            n["metadata"]["name"]
            for n in nodes
            if any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions", []))
        }

    def _write_status(self, body: Object, status: dict[str, Any]) -> None:
        meta = body["metadata"]
        old = body.get("status") or {}
        if old.get("phase") != status.get("phase"):
            self._event(body, "Warning" if status["phase"] in ("Failed", "Degraded") else "Normal",
                        f"Phase{status['phase']}", _phase_message(status))  # fmt: skip
            log.info("phase", extra={"cache": meta["name"], "namespace": meta["namespace"], "phase": status["phase"]})
        if all(old.get(k) == v for k, v in status.items()):
            return
        try:
            self.api.patch(cache_path(meta["namespace"], meta["name"]) + "/status", {"status": status})
        except ApiError as error:
            if error.status != 404:
                raise

    def _event(self, body: Object, kind: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        now = _stamp(self.clock())
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


def _phase_message(status: dict[str, Any]) -> str:
    degraded = next((c for c in status["conditions"] if c["type"] == "Degraded"), None)
    if degraded and degraded["status"] == "True":
        return degraded["message"]
    return f"nodes ready {status.get('readyNodes')}, active {status.get('activeEngines')}, standby {status.get('standbyEngines')}"


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%SZ")
