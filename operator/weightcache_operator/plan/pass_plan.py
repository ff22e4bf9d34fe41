"""The plan of one pass: a snapshot in, one ordered list of actions (actions.py, in
``actions.ORDER``) out, which executor.py carries out in one go. Pure, apart from the daemons'
reports a daemon spec change reads to choose its strategy (daemonsets.py).

The planners run in the order their decisions depend on one another, each on the view the
actions planned before it will leave — what those writes do to the pods and DaemonSets is
folded into a copy of the snapshot (``foresee``), never into the snapshot itself, which the
executor updates with the API's answers:

1. the seeding credential and peers file (seeding.py), then the daemons' DaemonSets, on spec
   changes and resyncs (daemonsets.py);
2. the readiness gates (gate_sync.py): a daemon that failed turns its engines' gate False, and
3. the engines, the Service and the budget (engine_plan.py) see that gate in this very pass: the
   failover acts on it without waiting for the kubelet to drop the engines' Ready.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from weightcache_operator.objects import Object
from weightcache_operator.observe.daemon_status import DaemonStatusReader
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import Action, ApplyDaemonSet, DeleteDaemonSet, SetGate, in_order
from weightcache_operator.plan.daemonsets import plan_daemons
from weightcache_operator.plan.engine_plan import EnginePlan, plan_engines
from weightcache_operator.plan.gate_sync import plan_gates
from weightcache_operator.plan.gates import DAEMON_UID_ANNOTATION
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.seeding import plan_seeding
from weightcache_operator.spec import WeightCache


@dataclass
class PassPlan:
    actions: list[Action]
    """Everything the pass writes, in ``actions.ORDER``."""
    engines: EnginePlan
    """The engines' part: the rollout's report, the stranded replicas, the daemons' node count."""
    gates_expire: datetime | None
    """When the first gate kept through a daemon outage must be decided again (a pass then)."""
    view: Snapshot
    """The snapshot as the actions will leave it, as far as planning can tell (no server answers)."""


def plan_pass(
    cache: WeightCache,
    snapshot: Snapshot,
    want: Desired,
    now: datetime,
    *,
    apply: bool,
    grace: timedelta,
    daemon_status: DaemonStatusReader,
    unresponsive: Mapping[str, datetime] | None = None,
    settling: bool = False,
    new_group: Callable[[], str] = lambda: secrets.token_hex(3),
) -> PassPlan:
    """The pass's actions. ``apply``: plan the DaemonSets and apply the Service even where
    nothing changed (spec changes, resyncs, taking over); ``grace``: how long a gate is kept
    through a daemon outage; ``unresponsive``, ``settling``, ``new_group``: as ``plan_engines``."""
    view = _copy(snapshot)
    # The reports already read: planning the peers file sends no request (plan/seeding.py).
    seeding = plan_seeding(cache, view, daemon_status.known((view.namespace, view.name)), apply=apply)
    daemonsets = plan_daemons(cache, view, daemon_status) if apply else []
    foresee(view, daemonsets, now)
    gates, expires = plan_gates(view, now, grace)
    foresee(view, gates, now)
    engines = plan_engines(
        cache, view, want, now, apply_service=apply, unresponsive=unresponsive, settling=settling, new_group=new_group
    )
    return PassPlan(in_order([*seeding, *daemonsets, *gates, *engines.writes]), engines, expires, view)


def foresee(view: Snapshot, actions: Iterable[Action], now: datetime) -> None:
    """Folds into ``view`` what ``actions`` will write that later planners read: the DaemonSets
    applied and deleted, and the gates set (with the daemon each was granted on)."""
    for action in actions:
        match action:
            case ApplyDaemonSet(daemonset, live):
                view.daemonset_applied(_applied(daemonset, live))
            case DeleteDaemonSet(name):
                view.daemonset_deleted(name)
            case SetGate(pod, _, daemon_uid, gate):
                current = next((p for p in view.engine_pods if p["metadata"]["name"] == pod), None)
                if current is not None:
                    view.pod_changed(_gated(current, daemon_uid, gate))
            case _:
                pass


def _copy(snapshot: Snapshot) -> Snapshot:
    """A view to plan on: the snapshot's lists of its own (folding replaces entries, never edits
    an object in place) and no watches to tell of writes that have not happened."""
    return replace(
        snapshot,
        daemonsets=list(snapshot.daemonsets),
        daemon_pods=list(snapshot.daemon_pods),
        engine_pods=list(snapshot.engine_pods),
        holder_pods=list(snapshot.holder_pods),
        watches=None,
    )


def _applied(wanted: Object, live: Object | None) -> Object:
    """A DaemonSet as a server-side apply of ``wanted`` over ``live`` will leave it, for planning:
    the wanted labels and annotations over the live ones, the wanted spec, and the live object's
    identity and status (its controller's counts until it recounts)."""
    if live is None:
        return wanted
    meta, live_meta = wanted["metadata"], live["metadata"]
    merged = {
        **live_meta,
        **meta,
        "labels": {**(live_meta.get("labels") or {}), **(meta.get("labels") or {})},
        "annotations": {**(live_meta.get("annotations") or {}), **(meta.get("annotations") or {})},
    }
    return {**live, **wanted, "metadata": merged, "status": live.get("status") or {}}


def _gated(pod: Object, daemon_uid: str | None, gate: Object | None) -> Object:
    """``pod`` as a ``SetGate`` leaves it: the daemon recorded, the gate condition replaced."""
    meta = pod["metadata"]
    if daemon_uid:
        meta = {**meta, "annotations": {**(meta.get("annotations") or {}), DAEMON_UID_ANNOTATION: daemon_uid}}
    status = pod.get("status") or {}
    if gate is not None:
        kept = [c for c in status.get("conditions") or [] if c.get("type") != gate["type"]]
        status = {**status, "conditions": [*kept, gate]}
    return {**pod, "metadata": meta, "status": status}
