"""The readiness gate ``weightcache.io/daemon-ready`` of an engine pod: what it should say.

Pure: pods and the clock in, a decision out; reconcile.py only patches what differs.

Granting the gate needs a Ready daemon pod on the engine's node holding the engine's generation
(and, with ``gpuAccess: dra``, sharing the engine's ResourceClaim): an engine that has still to
map its weights cannot do so without one.

Keeping it is more lenient, because an engine that has mapped its weights does not need its
daemon to serve: the keeper sidecar holds the arena and the engine's mapping stays valid while
the daemon container crashes, restarts and re-adopts the arena (the same logits after a SIGKILL
of the daemon, seen on GPU). Taking such an engine out of the Service would turn a daemon
restart into an outage when active and standby share the node. So a gate that is True stays
True while the engine is Ready apart from the gate (ContainersReady) and its node's daemon pod
is the very pod the gate was granted on (same UID, recorded in ``DAEMON_UID_ANNOTATION``), of the
engine's generation, not being deleted, on a Ready node, and NotReady for less than
``spec.engine.failover.daemonOutageGraceSeconds``. Past the grace, or when the daemon pod is
replaced (a new pod means a new keeper: the arena the engine maps is no longer held), the gate
turns False as before, which is the DaemonNotReady failover signal.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from .render.dra import engine_claim_current
from .render.layout import READY_GATE, SPEC_HASH_ANNOTATION

Pod = dict[str, Any]

DAEMON_UID_ANNOTATION = "weightcache.io/daemon-uid"
"""On an engine pod: the UID of the daemon pod its gate was granted on (the pod whose keeper
holds the arena the engine mapped)."""

GateReason = Literal["DaemonReady", "DaemonOutage", "DaemonNotReady"]


@dataclass(frozen=True)
class GateDecision:
    """What the gate should say. ``daemon_uid``: the daemon pod to record on the engine when the
    gate is granted or confirmed by a Ready daemon. ``expires``: when a gate kept through an
    outage must be decided again (the grace ends), None otherwise."""

    ready: bool
    reason: GateReason
    message: str
    daemon_uid: str | None = None
    expires: datetime | None = None


def gate_wanted(engine: Pod, daemons: Sequence[Pod], now: datetime, grace: timedelta,
                node_ready: bool = True) -> GateDecision:  # fmt: skip
    """The gate for ``engine`` given ``daemons``, the cache's daemon pods on the engine's node
    (usually one; two while one replaces another)."""
    node = (engine.get("spec") or {}).get("nodeName")
    generation = _annotation(engine, SPEC_HASH_ANNOTATION)
    if node_ready:
        for daemon in daemons:
            if (_ready(daemon) and not _deleting(daemon) and _annotation(daemon, SPEC_HASH_ANNOTATION) == generation
                    and engine_claim_current(engine, daemon)):  # fmt: skip
                return GateDecision(True, "DaemonReady", f"daemon {_name(daemon)} on {node} is ready with the expected spec",
                                    daemon_uid=daemon["metadata"].get("uid"))  # fmt: skip
    refused = GateDecision(False, "DaemonNotReady", f"daemon on {node} is not ready"
                           + ("" if node_ready else f" (node {node} is not Ready)"))  # fmt: skip
    if not node_ready or grace <= timedelta(0) or not _gate_true(engine) or not _containers_ready(engine):
        return refused
    uid = _annotation(engine, DAEMON_UID_ANNOTATION)
    daemon = next((d for d in daemons if uid and d["metadata"].get("uid") == uid), None)
    if daemon is None or _deleting(daemon) or _annotation(daemon, SPEC_HASH_ANNOTATION) != generation:
        return refused
    since = _not_ready_since(daemon)
    if since is None or now - since >= grace:
        return refused
    return GateDecision(True, "DaemonOutage",
                        f"daemon {_name(daemon)} on {node} is not ready since {_stamp(since)}; the engine keeps "
                        f"serving the weights it mapped until {_stamp(since + grace)}",
                        expires=since + grace)  # fmt: skip


def _not_ready_since(daemon: Pod) -> datetime | None:
    """When the daemon pod's Ready condition turned False (None: no such transition recorded,
    as for a pod that has not started: not one an engine mapped from)."""
    ready = next((c for c in (daemon.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    if not ready or ready.get("status") == "True" or not ready.get("lastTransitionTime"):
        return None
    return datetime.fromisoformat(str(ready["lastTransitionTime"]).replace("Z", "+00:00"))


def _condition(pod: Pod, kind: str) -> str | None:
    return next((c.get("status") for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def _gate_true(engine: Pod) -> bool:
    return _condition(engine, READY_GATE) == "True"


def _containers_ready(engine: Pod) -> bool:
    """Ready apart from the gate: the engine answers its readiness probe, so it has mapped."""
    return not _deleting(engine) and _condition(engine, "ContainersReady") == "True"


def _ready(pod: Pod) -> bool:
    return _condition(pod, "Ready") == "True"


def _deleting(pod: Pod) -> bool:
    return bool(pod["metadata"].get("deletionTimestamp"))


def _annotation(pod: Pod, key: str) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(key)


def _name(pod: Pod) -> str:
    return str(pod["metadata"].get("name"))


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
