"""Plans ``gates.gate_wanted`` on a cache's engine pods: a ``SetGate`` action (actions.py;
executor.py patches it) for each pod whose readiness gate ``weightcache.io/daemon-ready``, or the
daemon pod it relies on, differs from what it should be."""

from __future__ import annotations

from datetime import datetime, timedelta

from weightcache_operator.objects import Object, PodView, condition
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import Action, SetGate
from weightcache_operator.plan.gates import DAEMON_UID_ANNOTATION, gate_wanted
from weightcache_operator.vocabulary import READY_GATE


def plan_gates(snapshot: Snapshot, now: datetime, grace: timedelta) -> tuple[list[Action], datetime | None]:
    """Each scheduled, live engine pod's gate as ``gate_wanted`` decides (granted only on a Ready
    daemon of the engine's daemon spec; kept through a daemon outage shorter than ``grace``),
    recording the daemon pod it was granted on first — only what differs (a node going NotReady
    changes the gates of all its engines: the executor sends them at once). And when the first
    kept gate's grace ends (the pass to run then), None when no gate is kept."""
    unready = snapshot.unready_nodes()
    by_node: dict[str, list[Object]] = {}
    for daemon in snapshot.daemon_pods:
        if (node := PodView(daemon).node) is not None:
            by_node.setdefault(node, []).append(daemon)
    expiries: list[datetime] = []
    actions: list[Action] = []
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
            actions.append(SetGate(pod.name, node, record, gate))
    return actions, min(expiries, default=None)
