"""Carries out ``gates.gate_wanted`` on a cache's engine pods: patches the readiness gate
``weightcache.io/daemon-ready`` (and the daemon pod it relies on) where it differs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Executor
from datetime import datetime, timedelta
from functools import partial

from .gates import DAEMON_UID_ANNOTATION, gate_wanted
from .kubeapi import STRATEGIC_MERGE, ApiError, KubeApi
from .objects import Object, PodView, condition
from .render.layout import READY_GATE
from .snapshot import Snapshot
from .together import all_at_once

log = logging.getLogger("weightcache_operator.gate_sync")


def sync_gates(
    api: KubeApi, snapshot: Snapshot, now: datetime, grace: timedelta, pool: Executor | None = None
) -> datetime | None:
    """Sets each scheduled, live engine pod's gate as ``gate_wanted`` decides (granted only on a
    Ready daemon of the engine's daemon spec; kept through a daemon outage shorter than
    ``grace``), recording the daemon pod it was granted on first. Patches only what differs, the
    pods at once on ``pool`` (a node going NotReady changes the gates of all its engines); the
    snapshot gets the patched pods. Returns when the first kept gate's grace ends (the pass to
    run then), None when no gate is kept."""
    unready = snapshot.unready_nodes()
    by_node: dict[str, list[Object]] = {}
    for daemon in snapshot.daemon_pods:
        if (node := PodView(daemon).node) is not None:
            by_node.setdefault(node, []).append(daemon)
    expiries: list[datetime] = []
    patches: dict[str, Callable[[], list[Object]]] = {}
    for raw in snapshot.engine_pods:
        pod = PodView(raw)
        node = pod.node
        if not node or pod.deleting:
            continue
        decision = gate_wanted(raw, by_node.get(node, []), now, grace, node_ready=node not in unready)
        if decision.expires is not None:
            expiries.append(decision.expires)
        want = "True" if decision.ready else "False"
        have = pod.condition(READY_GATE)
        record = decision.daemon_uid if pod.annotations.get(DAEMON_UID_ANNOTATION) != decision.daemon_uid else None
        gate = None
        if have is None or (have.get("status"), have.get("reason")) != (want, decision.reason):
            gate = condition(READY_GATE, want, decision.reason, decision.message, now, [have] if have else [])
        if record or gate:
            patches[pod.name] = partial(_patch, api, snapshot.namespace, pod.name, record, gate, node)
    for patched in all_at_once(pool, **patches).values():
        for pod_now in patched:
            snapshot.pod_changed(pod_now)
    return min(expiries, default=None)


def _patch(
    api: KubeApi, namespace: str, name: str, daemon_uid: str | None, gate: Object | None, node: str
) -> list[Object]:
    """One engine pod's patches, in order: the daemon it relies on, then its gate. Returns the
    pod as each patch left it; none once the pod is gone."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    patched: list[Object] = []
    try:
        if daemon_uid:
            # Before the gate: a gate is never True without the daemon pod it relies on named.
            patched.append(api.patch(path, {"metadata": {"annotations": {DAEMON_UID_ANNOTATION: daemon_uid}}}))
        if gate is not None:
            patched.append(api.patch(f"{path}/status", {"status": {"conditions": [gate]}}, STRATEGIC_MERGE))
            log.info(
                "readiness gate",
                extra={"pod": name, "node": node, "status": gate["status"], "reason": gate["reason"]},
            )
    except ApiError as error:
        if error.status != 404:
            raise
    return patched
