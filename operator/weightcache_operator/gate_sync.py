"""Carries out ``gates.gate_wanted`` on a cache's engine pods: patches the readiness gate
``weightcache.io/daemon-ready`` (and the daemon pod it relies on) where it differs."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from .gates import DAEMON_UID_ANNOTATION, gate_wanted
from .kubeapi import STRATEGIC_MERGE, ApiError, KubeApi
from .objects import Object, PodView, condition
from .render.layout import READY_GATE
from .snapshot import Snapshot

log = logging.getLogger("weightcache_operator.gate_sync")


def sync_gates(api: KubeApi, snapshot: Snapshot, now: datetime, grace: timedelta) -> datetime | None:
    """Sets each scheduled, live engine pod's gate as ``gate_wanted`` decides (granted only on a
    Ready daemon of the engine's daemon spec; kept through a daemon outage shorter than
    ``grace``), recording the daemon pod it was granted on first. Patches only what differs; the
    snapshot gets the patched pods. Returns when the first kept gate's grace ends (the pass to
    run then), None when no gate is kept."""
    unready = snapshot.unready_nodes()
    by_node: dict[str, list[Object]] = {}
    for daemon in snapshot.daemon_pods:
        if (node := PodView(daemon).node) is not None:
            by_node.setdefault(node, []).append(daemon)
    expiries: list[datetime] = []
    for raw in list(snapshot.engine_pods):
        pod = PodView(raw)
        node = pod.node
        if not node or pod.deleting:
            continue
        decision = gate_wanted(raw, by_node.get(node, []), now, grace, node_ready=node not in unready)
        if decision.expires is not None:
            expiries.append(decision.expires)
        path = f"/api/v1/namespaces/{snapshot.namespace}/pods/{pod.name}"
        want = "True" if decision.ready else "False"
        have = pod.condition(READY_GATE)
        try:
            if decision.daemon_uid and pod.annotations.get(DAEMON_UID_ANNOTATION) != decision.daemon_uid:
                # Before the gate: a gate is never True without the daemon pod it relies on named.
                patched = api.patch(path, {"metadata": {"annotations": {DAEMON_UID_ANNOTATION: decision.daemon_uid}}})
                snapshot.pod_changed(patched)
            if have is not None and (have.get("status"), have.get("reason")) == (want, decision.reason):
                continue
            gate = condition(READY_GATE, want, decision.reason, decision.message, now, [have] if have else [])
            snapshot.pod_changed(api.patch(f"{path}/status", {"status": {"conditions": [gate]}}, STRATEGIC_MERGE))
            log.info("readiness gate", extra={"pod": pod.name, "node": node, "status": want, "reason": decision.reason})
        except ApiError as error:
            if error.status != 404:
                raise
    return min(expiries, default=None)
