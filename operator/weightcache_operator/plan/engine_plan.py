"""The engines' plan for one pass: a snapshot and what the spec asks for in, actions (actions.py)
and the rollout report out. Pure.

One planner for engines of every size (a single-pod engine is a group of one: engine_units.py),
in two steps over one vocabulary:

- the rollout (``rollout.planner.plan``) moves replicas to the wanted engine template and daemon spec
  hash — surge, promote, drain, replace a daemon — reports how far it got, and says which
  generation the Service selects;
- scaling and failover (scaling.py, ``failover.plan_replica`` per replica) keep exactly
  ``replicas`` active units and ``standbysPerReplica`` standby units per replica, promoting a
  standby over a failed active, and create the rollout's surge units.

The rollout's actions come first within each step of ``actions.ORDER``. Scaling plans over the
engine units as those actions leave them (``Plan.units``), in which the rollout's surge units are
``Unit.held``: scaling must neither count nor trim them. Units created in this pass are not seen
by it: they count from the next pass on.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from weightcache_operator.objects import Object, PodView, spec_hash
from weightcache_operator.observe.failures import cordoned_nodes
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import (
    Action,
    RecountBudget,
    SetRole,
    SyncRouting,
    in_order,
)
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.plan.scaling import plan_scaling
from weightcache_operator.render.daemon import slot_base
from weightcache_operator.render.engine import engine_template_hash
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import SLOT_LABEL


@dataclass
class EnginePlan:
    actions: list[Action]
    """The engines', the Service's and the old DaemonSets' actions, in ``actions.ORDER``."""
    rollout: Plan
    """The rollout's report: mode, phase, step, replicas updated, why it stalled."""
    stranded: list[str] = field(default_factory=list)
    """Replicas whose active failed with no Ready standby to take over (the Degraded condition)."""
    desired_nodes: int = 0
    """Nodes the daemon DaemonSets of the wanted spec should run on."""

    @property
    def writes(self) -> list[Action]:
        """What the pass carries out: ``actions``, the InferencePool after the Service
        (``SyncRouting``), and the budget recount over the engines as they left them
        (``RecountBudget``; always after a demotion), in ``actions.ORDER``."""
        demoted = any(isinstance(a, SetRole) and a.role == "standby" for a in self.actions)
        return in_order([*self.actions, SyncRouting(), RecountBudget(demoted)])


def desired(cache: WeightCache) -> Desired:
    engine = cache.spec.engine
    return Desired(
        engine_hash=engine_template_hash(cache),
        daemon_hash=daemon_spec_hash(cache),
        replicas=engine.replicas,
        standbys=engine.standbys_per_replica,
        ready_deadline_s=engine.rollout.ready_deadline_seconds,
        max_surge=engine.rollout.max_surge,
    )


def set_name(daemonset: Object) -> str:
    """What names a generation's daemons: the DaemonSet's name, or a slot DaemonSet's base."""
    return slot_base(daemonset) if SLOT_LABEL in daemonset["metadata"]["labels"] else str(daemonset["metadata"]["name"])


def old_side(daemonset: Object, wanted: str, daemon_hash: str) -> bool:
    """A DaemonSet of another daemon spec hash than ``daemon_hash`` that a blue/green change left
    next to the wanted one (``wanted``: its ``set_name``): kept until drained."""
    return spec_hash(daemonset) != daemon_hash and set_name(daemonset) != wanted


def nodes_to_run(daemonset: Object, daemon_pods: list[Object], down: Collection[str]) -> int:
    """The nodes ``daemonset`` should run a daemon on: ``status.desiredNumberScheduled`` less the
    nodes that are down but still counted in it.

    A node that goes NotReady is tainted unreachable (or not-ready) NoSchedule, so the
    DaemonSet controller stops counting it; its daemon pod stays (it tolerates the NoExecute
    taint) and then counts as misscheduled. But the controller recounts a DaemonSet on a node
    change only when a pod must be created or deleted there (Kubernetes 1.35): a count taken just
    before the taint reached its cache stays until something else makes it sync the DaemonSet,
    and the cache would wait for the dead node's daemon until then. Down nodes still counted =
    this DaemonSet's pods on down nodes − misscheduled."""
    status = daemonset.get("status") or {}
    uid = daemonset["metadata"].get("uid")
    on_down_nodes = sum(
        1
        for pod in daemon_pods
        if (view := PodView(pod)).node in down
        and not view.deleting
        and any(ref.get("uid") == uid for ref in pod["metadata"].get("ownerReferences") or [])
    )
    stale = max(0, on_down_nodes - int(status.get("numberMisscheduled") or 0))
    return max(0, int(status.get("desiredNumberScheduled") or 0) - stale)


def plan_engines(
    cache: WeightCache,
    snapshot: Snapshot,
    want: Desired,
    now: datetime,
    *,
    apply_service: bool,
    unresponsive: Mapping[str, datetime] | None = None,
    new_group: Callable[[], str] = lambda: secrets.token_hex(3),
    settling: bool = False,
) -> EnginePlan:
    """The pass's actions for the engines and the Service. ``apply_service``: apply the Service
    even when its generation does not change (spec changes, resync); ``unresponsive``: engines
    the operator's own probes found silent (responsiveness.py); ``new_group``: a new engine
    group's id; ``settling``: the Service switched generation moments ago (rollout.Plan.switching)."""
    current_sets = snapshot.daemonsets_of(want.daemon_hash)
    # A blue/green change's old side: DaemonSets of another generation next to the current one.
    old_sets = {
        ds["metadata"]["name"]: spec_hash(ds)
        for ds in snapshot.daemon_daemonsets
        if current_sets and old_side(ds, set_name(current_sets[0]), want.daemon_hash)
    }
    down = snapshot.unready_nodes()
    desired_nodes = sum(
        nodes_to_run(ds, snapshot.daemon_pods, down) for ds in current_sets or snapshot.daemon_daemonsets
    )
    engines, serving, size = snapshot.engine_pods, snapshot.serving, cache.spec.parallelism.nodes
    steps = plan(
        want,
        engines,
        snapshot.daemon_pods,
        serving,
        now,
        snapshot.previous.rollout,
        desired_nodes,
        old_sets,
        size=size,
        settling=settling,
        apply_service=apply_service,
    )
    ready = snapshot.ready_daemons_by_slot(want.daemon_hash, size)
    scaled, stranded = plan_scaling(
        cache,
        steps.units,
        ready,
        new_group,
        snapshot.unready_nodes(),
        unresponsive,
        surge=steps.create,
        cordoned=cordoned_nodes(snapshot.nodes),
    )
    return EnginePlan(in_order([*steps.actions, *scaled]), steps, stranded, desired_nodes)
