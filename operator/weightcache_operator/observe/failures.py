"""What failed: an engine pod's failure (the signal, since when, and whether it is final) from
the pod and its node as the API server shows them, and the nodes that are NotReady or cordoned.

Observation only, no decisions: sightings.py times the operator's first sight of each failure
from it, and failover.py decides what a failed unit's replica does about it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from weightcache_operator.objects import NodeView, Object, PodView, parse_time, pod_ready
from weightcache_operator.spec import FailoverSignal
from weightcache_operator.vocabulary import READY_GATE

Signal = FailoverSignal

# A crash's finishedAt and the Ready=False it causes are stamped by the kubelet within moments
# of each other, but at one-second resolution; an older termination is a past restart.
_SAME_INCIDENT = timedelta(seconds=2)


@dataclass(frozen=True)
class Failure:
    """Why an engine pod can no longer serve, and since when."""

    signal: Signal
    since: datetime | None
    """The failure's timestamp as the API server recorded it (deletion requested, container
    finished, condition or node condition transition). The API keeps these to the whole second,
    truncated: good for how old a failure is in seconds, never for how fast it was seen (that is
    measured from the operator's own first sight: sightings.py). None when the API shows none (a
    node object that is gone) or the signal is the operator's own (``Unresponsive``)."""
    detail: str
    final: bool
    """The pod will not serve again (deleted, terminal, on a NotReady node): promoting any
    healthy standby, even one still starting, beats waiting for it."""
    retire: bool = True
    """Delete the pod once a standby has taken over. False for the one verdict that may be wrong
    (``Unresponsive``: slow looks like hung from outside): the pod is demoted to standby instead,
    so it finishes what it serves and a wrong verdict costs a role swap, not an engine."""
    seen: datetime | None = None
    """The operator's own sub-second instant of the failure, where the signal itself carries one:
    for ``Unresponsive``, when the first probe the engine left unanswered was sent."""


def failure_of(
    pod: Object,
    unready_nodes: Mapping[str, datetime | None],
    unresponsive: Mapping[str, datetime] | None = None,
    cordoned: Collection[str] = frozenset(),
) -> Failure | None:
    """The failure of an engine pod, or None while it is Ready or has never been Ready yet
    (starting: not a failure, so it is never deleted for it). ``unresponsive``: pod name → when
    it stopped answering its readiness endpoint (responsiveness.py), for pods the kubelet still
    calls Ready: the operator's own probe sees a hang before the kubelet's does. ``cordoned``:
    nodes marked unschedulable (``cordoned_nodes``); a pod there that has failed in no other way
    has ``NodeCordoned``."""
    meta, status = pod["metadata"], pod.get("status") or {}
    name = meta["name"]
    if meta.get("deletionTimestamp"):
        # deletionTimestamp is when the grace period *ends*; the request came that much earlier.
        grace = meta.get("deletionGracePeriodSeconds") or 0
        since = parse_time(meta["deletionTimestamp"])
        return Failure(
            "PodDeleted", since - timedelta(seconds=grace) if since else None, f"{name} is being deleted", True
        )
    if status.get("phase") in ("Failed", "Succeeded"):
        evicted = status.get("reason") == "Evicted"
        finished = _latest(
            parse_time((c.get("state", {}).get("terminated") or {}).get("finishedAt"))
            for c in status.get("containerStatuses") or []
        )
        return Failure(
            "PodEvicted" if evicted else "PodFailed",
            finished,
            f"{name} is {status.get('phase')}" + (f": {status['message']}" if status.get("message") else ""),
            True,
        )
    node = (pod.get("spec") or {}).get("nodeName")
    if node and node in unready_nodes:
        return Failure("NodeNotReady", unready_nodes[node], f"node {node} of {name} is not Ready", True)
    disruption = PodView(pod).condition("DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        # The API marks a pod it is about to evict, preempt or stop; its deletion follows, so any
        # healthy standby beats it. Demoted rather than deleted: whoever marked it deletes it,
        # and a disruption that does not come costs a role swap, not an engine.
        return Failure(
            "DisruptionTarget",
            parse_time(disruption.get("lastTransitionTime")),
            f"{name} is about to be disrupted ({disruption.get('reason')}: {disruption.get('message', '')})",
            True,
            retire=False,
        )
    gate = PodView(pod).condition(READY_GATE)
    if gate and gate.get("status") == "False":
        # Ahead of Ready: the operator sets the gate, and the kubelet drops Ready only after it.
        return Failure(
            "DaemonNotReady",
            parse_time(gate.get("lastTransitionTime")),
            f"the daemon on {node} of {name} is not Ready",
            False,
        )
    if pod_ready(pod):
        silent = (unresponsive or {}).get(name)
        if silent is None:
            return _cordoned(name, node, cordoned)
        return Failure(
            "Unresponsive",
            None,
            f"{name} has answered no readiness request since "
            f"{silent.astimezone(UTC).isoformat(timespec='milliseconds')}",
            False,
            retire=False,
            seen=silent,
        )
    ready = PodView(pod).condition("Ready")
    ready_since = parse_time(ready.get("lastTransitionTime")) if ready else None
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if state.get("terminated") or (state.get("waiting") or {}).get("reason") == "CrashLoopBackOff":
            ended = parse_time(
                (state.get("terminated") or (container.get("lastState") or {}).get("terminated") or {}).get(
                    "finishedAt"
                )
            )
            return Failure("ContainerRestarted", ended, f"container {container.get('name')} of {name} exited", False)
        ended = parse_time(((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        if ended and (ready_since is None or ended >= ready_since - _SAME_INCIDENT):
            return Failure("ContainerRestarted", ended, f"container {container.get('name')} of {name} restarted", False)
    # Ready turned False after the container started: it had been Ready (a pod that was never
    # Ready keeps the False it got before its container started).
    started = _latest(
        parse_time((c.get("state", {}).get("running") or {}).get("startedAt"))
        for c in status.get("containerStatuses") or []
    )
    if ready_since and started and ready_since > started:
        return Failure("ReadinessFailed", ready_since, f"{name} fails its readiness probe", False)
    return _cordoned(name, node, cordoned)


def _cordoned(name: str, node: str | None, cordoned: Collection[str]) -> Failure | None:
    """A pod that is fine on a node that is cordoned: ``kubectl drain`` cordons a node before it
    evicts its pods, and the disruption budget (render/budget.py) refuses to evict an active, so
    the remedy is a Ready standby on a schedulable node taking over and the pod demoted — then
    the drain's next eviction of it goes through. Not final (it serves until then, and the node
    may be uncordoned); the API gives no time for a cordon, so there is none to measure from."""
    if node is None or node not in cordoned:
        return None
    return Failure(
        "NodeCordoned",
        None,
        f"node {node} of {name} is cordoned (unschedulable: drained, or about to be)",
        False,
        retire=False,
    )


def unready_nodes(nodes: list[dict[str, Any]]) -> dict[str, datetime | None]:
    """Node name → when its Ready condition left True, for every node that is not Ready."""
    views = [NodeView(n) for n in nodes]
    return {n.name: n.ready_changed for n in views if not n.ready}


def cordoned_nodes(nodes: list[dict[str, Any]]) -> frozenset[str]:
    """The nodes marked unschedulable (``kubectl cordon``, the first step of ``kubectl drain``)."""
    return frozenset(v.name for v in map(NodeView, nodes) if v.cordoned)


def _latest(stamps: Any) -> datetime | None:
    found = [s for s in stamps if s is not None]
    return max(found) if found else None
