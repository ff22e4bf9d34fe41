"""The readiness gate ``weightcache.io/daemon-ready`` of an engine pod: what it should say.

Pure: pods and the clock in, a decision out; gate_sync.py plans a patch of what differs.

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
from typing import Literal

from weightcache_operator.objects import Object, PodView, parse_time, stamp
from weightcache_operator.render.dra import engine_claim_current
from weightcache_operator.vocabulary import READY_GATE

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


def gate_wanted(
    engine: Object, daemons: Sequence[Object], now: datetime, grace: timedelta, node_ready: bool = True
) -> GateDecision:
    """The gate for ``engine`` given ``daemons``, the cache's daemon pods on the engine's node
    (usually one; two while one replaces another)."""
    pod = PodView(engine)
    node, generation = pod.node, pod.spec_hash
    if node_ready:
        for raw in daemons:
            daemon = PodView(raw)
            if daemon.ready and daemon.spec_hash == generation and engine_claim_current(engine, raw):
                return GateDecision(
                    True,
                    "DaemonReady",
                    f"daemon {daemon.name} on {node} is ready with the expected spec",
                    daemon_uid=daemon.uid,
                )
    refused = GateDecision(
        False,
        "DaemonNotReady",
        f"daemon on {node} is not ready" + ("" if node_ready else f" (node {node} is not Ready)"),
    )
    # Ready apart from the gate (ContainersReady): the engine answers its readiness probe, so it has mapped.
    mapped = not pod.deleting and pod.condition_status("ContainersReady") == "True"
    if not node_ready or grace <= timedelta(0) or pod.condition_status(READY_GATE) != "True" or not mapped:
        return refused
    uid = pod.annotations.get(DAEMON_UID_ANNOTATION)
    granted = next((PodView(d) for d in daemons if uid and PodView(d).uid == uid), None)
    if granted is None or granted.deleting or granted.spec_hash != generation:
        return refused
    since = _not_ready_since(granted)
    if since is None or now - since >= grace:
        return refused
    return GateDecision(
        True,
        "DaemonOutage",
        f"daemon {granted.name} on {node} is not ready since {stamp(since)}; the engine keeps "
        f"serving the weights it mapped until {stamp(since + grace)}",
        expires=since + grace,
    )


def _not_ready_since(daemon: PodView) -> datetime | None:
    """When the daemon pod's Ready condition turned False (None: no such transition recorded,
    as for a pod that has not started: not one an engine mapped from)."""
    ready = daemon.condition("Ready")
    if not ready or ready.get("status") == "True":
        return None
    return parse_time(ready.get("lastTransitionTime"))
