"""Carries out a pass's engine actions (actions.py) against the API server, in the order they
come (``engine_plan`` puts them in ``actions.ORDER``), and writes the API's answers into the
pass's snapshot. No decisions here beyond what each action says."""

from __future__ import annotations

import logging
from concurrent.futures import Executor
from datetime import datetime
from functools import partial
from typing import Any

from .actions import Action, ApplyService, Create, Delete, DeleteDaemonSet, Failover, ReplaceDaemon, SetRole
from .applying import apply_if_different
from .kubeapi import ApiError, KubeApi
from .objects import PodView
from .render.budget import engine_budget
from .render.gpu_holder import stale_holder, uses_gpu_holder
from .render.layout import ROLE_LABEL, SERVING_ANNOTATION
from .render.service import engine_service
from .report import Reporter
from .snapshot import Snapshot
from .spec import WeightCache
from .together import all_at_once

log = logging.getLogger("weightcache_operator.executor")


def execute(
    api: KubeApi,
    reporter: Reporter,
    cache: WeightCache,
    snapshot: Snapshot,
    actions: list[Action],
    noticed: datetime,
    pool: Executor | None = None,
) -> dict[str, Any] | None:
    """Carries out ``actions``; returns the ``status.lastFailover`` entry of the last failover
    among them, if any. ``noticed``: when the pass started, after reading the cluster (what
    detection is measured to and promotion from). Independent requests of one action, and
    consecutive creations, go out at once on ``pool`` (together.py)."""
    pods = f"/api/v1/namespaces/{snapshot.namespace}/pods"
    failover = None
    demoted = False
    creations: list[Create] = []
    for i, action in enumerate(actions):
        if isinstance(action, SetRole):
            changed = api.patch(f"{pods}/{action.name}", {"metadata": {"labels": {ROLE_LABEL: action.role}}})
            snapshot.pod_changed(changed)
            demoted = demoted or action.role == "standby"
            log.info("relabelled engine", extra={"pod": action.name, "role": action.role})
        elif isinstance(action, Failover):
            failover = reporter.failover(snapshot.body, action.promotion, noticed) or failover
        elif isinstance(action, ApplyService):
            service = engine_service(cache, action.serve)
            # The budget follows the Service: it protects exactly what the Service sends traffic
            # to. Independent objects: applied at once.
            budget = engine_budget(cache, action.serve)
            applied = all_at_once(
                pool,
                service=partial(
                    apply_if_different,
                    api,
                    f"/api/v1/namespaces/{snapshot.namespace}/services/{service['metadata']['name']}",
                    service,
                    snapshot.service,
                ),
                budget=partial(
                    apply_if_different,
                    api,
                    f"/apis/policy/v1/namespaces/{snapshot.namespace}/poddisruptionbudgets/{budget['metadata']['name']}",
                    budget,
                    snapshot.budget,
                ),
            )
            snapshot.service, snapshot.budget = applied["service"], applied["budget"]
        elif isinstance(action, Delete):
            api.delete(f"{pods}/{action.name}")
            snapshot.pod_deleted(action.name, reporter.clock())
            log.info("deleted engine", extra={"pod": action.name, "reason": action.why})
        elif isinstance(action, Create):
            creations.append(action)
            if i + 1 < len(actions) and isinstance(actions[i + 1], Create):
                continue  # the next one goes out with it
            # Consecutive creations are new engine pods of their own (a group's followers come in
            # a later pass, once its leader has an address): sent at once.
            created = all_at_once(pool, **{str(k): partial(api.create, pods, c.pod) for k, c in enumerate(creations)})
            for k, wanted in enumerate(creations):
                snapshot.pod_changed(created[str(k)])
                log.info(
                    "created engine", extra={"pod": PodView(created[str(k)]).name, "role": PodView(wanted.pod).role}
                )
            creations = []
        elif isinstance(action, ReplaceDaemon):
            _replace_stale_holder(api, cache, snapshot, action.pod, reporter.clock())
            api.delete(f"{pods}/{action.pod}")
            snapshot.pod_deleted(action.pod, reporter.clock())
            log.info("replacing daemon", extra={"pod": action.pod, "reason": "generation change"})
        elif isinstance(action, DeleteDaemonSet):
            # Background: the garbage collector deletes its pods (keepers and arenas with them).
            api.delete(
                f"/apis/apps/v1/namespaces/{snapshot.namespace}/daemonsets/{action.name}", propagation="Background"
            )
            snapshot.daemonset_deleted(action.name)
            log.info(
                "deleted daemonset", extra={"daemonset": action.name, "reason": "blue/green: old generation drained"}
            )
    if demoted or _budget_overcounts(snapshot):
        _recount_budget(api, snapshot, reporter.clock())
    return failover


def _budget_overcounts(snapshot: Snapshot) -> bool:
    """Whether the budget's status counts more healthy pods than it selects in the pass's view:
    what a recount after an earlier demotion missed (the controller's pod cache behind its own
    budget event) leaves. Counting fewer is safe (evictions wait) and the next pod event fixes it."""
    if snapshot.budget is None:
        return False
    selector = ((snapshot.budget.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    healthy = (snapshot.budget.get("status") or {}).get("currentHealthy")
    matching = [p for p in snapshot.engine_pods if selector and selector.items() <= PodView(p).labels.items()]
    return isinstance(healthy, int) and healthy > len(matching)


def _recount_budget(api: KubeApi, snapshot: Snapshot, now: datetime) -> None:
    """Makes the disruption controller count the budget's pods again. It recounts a budget when a
    pod that matches it changes, judged by the pod's new labels only, so a pod relabelled out of
    the budget (an active demoted after its successor's promotion, both active for a moment) leaves
    its count stale: it would go on counting two healthy actives and allow evicting the one that
    serves. Any change to the budget makes it recount: the annotation names the actives the pass
    left serving (not those it deleted), and when."""
    if snapshot.budget is None:
        return
    engines = (PodView(p) for p in snapshot.engine_pods)
    actives = ",".join(sorted(p.name for p in engines if p.role == "active" and not p.deleting))
    # The time makes each value new (an active promoted and demoted again between two recounts
    # would leave the names as they were, and the budget unchanged).
    value = f"{actives} ({now.isoformat(timespec='milliseconds')})"
    path = f"/apis/policy/v1/namespaces/{snapshot.namespace}/poddisruptionbudgets/{snapshot.budget['metadata']['name']}"
    try:
        snapshot.budget = api.patch(path, {"metadata": {"annotations": {SERVING_ANNOTATION: value}}})
    except ApiError as error:
        if error.status != 404:
            raise


def _replace_stale_holder(api: KubeApi, cache: WeightCache, snapshot: Snapshot, daemon_pod: str, now: datetime) -> None:
    """Node by node with a new GPU count: deletes the GPU holder pod of the node whose daemon is
    being replaced, if it books another number of GPUs (its DaemonSet is OnDelete), so the new
    daemon waits for a holder with the new count. Only here: the node's engines are drained and
    its daemon is going, so nothing uses the GPUs it un-books for a moment."""
    if not uses_gpu_holder(cache):
        return
    node = next((PodView(p).node for p in snapshot.daemon_pods if PodView(p).name == daemon_pod), None)
    for pod in snapshot.holder_pods:
        if node and PodView(pod).node == node and stale_holder(cache, pod):
            api.delete(f"/api/v1/namespaces/{snapshot.namespace}/pods/{PodView(pod).name}")
            snapshot.pod_deleted(PodView(pod).name, now)
            log.info("replacing gpu holder", extra={"pod": PodView(pod).name, "reason": "GPUs per node changed"})
