"""Carries out a pass's engine actions (actions.py) against the API server, in the order they
come (``engine_plan`` puts them in ``actions.ORDER``), and writes the API's answers into the
pass's snapshot. No decisions here beyond what each action says."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from .actions import Action, ApplyService, Create, Delete, DeleteDaemonSet, Failover, ReplaceDaemon, SetRole
from .applying import apply_if_different
from .kubeapi import KubeApi
from .objects import PodView
from .render.budget import engine_budget
from .render.gpu_holder import stale_holder, uses_gpu_holder
from .render.layout import ROLE_LABEL
from .render.service import engine_service
from .report import Reporter
from .snapshot import Snapshot
from .spec import WeightCache

log = logging.getLogger("weightcache_operator.executor")


def execute(
    api: KubeApi, reporter: Reporter, cache: WeightCache, snapshot: Snapshot, actions: list[Action], noticed: datetime
) -> dict[str, Any] | None:
    """Carries out ``actions``; returns the ``status.lastFailover`` entry of the last failover
    among them, if any. ``noticed``: when the pass started, after reading the cluster (what
    detection is measured to and promotion from)."""
    pods = f"/api/v1/namespaces/{snapshot.namespace}/pods"
    failover = None
    for action in actions:
        if isinstance(action, SetRole):
            changed = api.patch(f"{pods}/{action.name}", {"metadata": {"labels": {ROLE_LABEL: action.role}}})
            snapshot.pod_changed(changed)
            log.info("relabelled engine", extra={"pod": action.name, "role": action.role})
        elif isinstance(action, Failover):
            failover = reporter.failover(snapshot.body, action.promotion, noticed) or failover
        elif isinstance(action, ApplyService):
            service = engine_service(cache, action.serve)
            snapshot.service = apply_if_different(
                api,
                f"/api/v1/namespaces/{snapshot.namespace}/services/{service['metadata']['name']}",
                service,
                snapshot.service,
            )
            # The budget follows the Service: it protects exactly what the Service sends traffic to.
            budget = engine_budget(cache, action.serve)
            snapshot.budget = apply_if_different(
                api,
                f"/apis/policy/v1/namespaces/{snapshot.namespace}/poddisruptionbudgets/{budget['metadata']['name']}",
                budget,
                snapshot.budget,
            )
        elif isinstance(action, Delete):
            api.delete(f"{pods}/{action.name}")
            snapshot.pod_deleted(action.name, reporter.clock())
            log.info("deleted engine", extra={"pod": action.name, "reason": action.why})
        elif isinstance(action, Create):
            created = api.create(pods, action.pod)
            snapshot.pod_changed(created)
            log.info("created engine", extra={"pod": PodView(created).name, "role": PodView(action.pod).role})
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
    return failover


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
