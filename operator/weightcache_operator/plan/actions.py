"""What a pass does to the cluster, as values: the planners return them (daemonsets.py for the
DaemonSets, gate_sync.py for the readiness gates, rollout/planner.py, scaling.py and failover.py
for the engines and the Service, joined by engine_plan.py with the budget), pass_plan.py puts
them in one list in ``ORDER``, and the executor (executor.py) carries that list out.

``ORDER`` is what keeps the Service serving through every change: endpoints are added before
the Service changes and removed after it. What daemons need comes first: the seeding credential
(a daemon pod mounts it, not optionally) and the peers file; what engines need next: the GPU claim template
and the GPU holder before the daemons that use them, the daemons' DaemonSets, the gates that say
where a daemon is Ready. Engines are relabelled active first (a promoted standby joins the
Service's endpoints), then the failovers are recorded, then the Service is applied (switching
daemon spec hash when the plan says so) and the InferencePool follows it, then engines are
relabelled standby (a demoted active leaves the endpoints only once the Service selects its
successor: in a blue/green switch the old active is demoted in the very pass the Service moves
away from it), and only then are pods deleted — each with its grace period, so in-flight
requests finish — and new ones created; daemons and DaemonSets, which engines map, go after the
engines; the budget is recounted last, over the engines as every other write left them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from weightcache_operator.objects import Object
from weightcache_operator.observe.failures import Failure


@dataclass(frozen=True)
class Promotion:
    """A standby taking over from a failed (or missing) active (failover.plan_replica decides it)."""

    replica: int
    promoted: Object
    failed: Object | None
    failure: Failure | None
    failed_pods: tuple[Object, ...] = ()
    """Every pod of the failed unit (``failed`` is its head): the failure was first seen when the
    first of them was (a group fails with any of its pods)."""


@dataclass(frozen=True)
class CreateSeedingSecret:
    """``spec.daemon.seeding`` on: create the cache's credential Secret unless it exists (planned on
    full passes: the operator cannot read Secrets). Carries no bytes: the executor makes them
    (render/seeding.py), so no plan, log or result holds them."""

    name: str


@dataclass(frozen=True)
class ApplySeedPeers:
    """Apply the cache's peers ConfigMap (plan/seeding.py) where it differs from ``live``."""

    configmap: Object
    live: Object | None


@dataclass(frozen=True)
class ApplyClaimTemplate:
    """``gpuAccess: dra``: server-side apply the ResourceClaimTemplate the daemon pods claim GPUs from."""

    template: Object


@dataclass(frozen=True)
class ApplyDaemonSet:
    """Apply a DaemonSet where it differs from ``live`` (applying.py): the daemons' (one per node
    slot with ``parallelism.nodes > 1``, sent at once), or with ``holder`` the GPU holder's, which
    goes first: the daemons wait for its grant."""

    daemonset: Object
    live: Object | None
    holder: bool = False


@dataclass(frozen=True)
class SetGate:
    """Patch an engine pod's readiness gate (gates.gate_wanted) and, first, the daemon pod it
    relies on (``daemon_uid``), each only when given. Consecutive ones go at once."""

    pod: str
    node: str
    daemon_uid: str | None
    gate: Object | None


@dataclass(frozen=True)
class SetRole:
    """Relabel an engine pod active or standby (the Service selects actives)."""

    name: str
    role: str


@dataclass(frozen=True)
class Failover:
    """A standby took over from a failed active (its SetRole comes first): status.lastFailover,
    an Event and the metrics. With no failure, a swap for an active never Ready: logged only."""

    promotion: Promotion


@dataclass(frozen=True)
class ApplyService:
    """Server-side apply the engine Service, selecting the engines of daemon spec hash ``serve``,
    and the PodDisruptionBudget over the same engines (render/budget.py)."""

    serve: str


@dataclass(frozen=True)
class SyncRouting:
    """``spec.routing.inferencePool`` (routing.py): apply the managed InferencePool on the
    generation the Service selects as the pass left it, or check the referenced one; delete a
    managed pool the spec no longer wants. Its outcome is ``status.inferencePool`` and the
    InferencePoolReady condition. Planned in every pass: without routing it sends a request only
    when a managed pool is left to delete."""


@dataclass(frozen=True)
class Delete:
    """Delete an engine pod with its grace period (it drains)."""

    name: str
    why: str


@dataclass(frozen=True)
class Create:
    pod: Object


@dataclass(frozen=True)
class ReplaceDaemon:
    """Node by node: delete a drained node's daemon pod (its DaemonSet is OnDelete and recreates it)."""

    pod: str


@dataclass(frozen=True)
class DeleteDaemonSet:
    """Delete a DaemonSet of the cache, its pods (keepers and arenas with them) in the background:
    blue/green's drained old generation, a layout no longer wanted, a GPU holder no longer needed."""

    name: str
    why: str


@dataclass(frozen=True)
class RecountBudget:
    """Make the disruption controller count the budget's pods again (executor.py says why): always
    with ``demoted`` (an active left the budget's selection in this pass), else only when the
    budget counts more healthy pods than it selects as the pass's writes left them."""

    demoted: bool


Action = (
    CreateSeedingSecret
    | ApplySeedPeers
    | ApplyClaimTemplate
    | ApplyDaemonSet
    | SetGate
    | SetRole
    | Failover
    | ApplyService
    | SyncRouting
    | Delete
    | Create
    | ReplaceDaemon
    | DeleteDaemonSet
    | RecountBudget
)

ORDER: tuple[str, ...] = (
    "CreateSeedingSecret",
    "ApplySeedPeers",
    "ApplyClaimTemplate",
    "ApplyGpuHolder",
    "ApplyDaemonSet",
    "SetGate",
    "promote",
    "Failover",
    "ApplyService",
    "SyncRouting",
    "demote",
    "Delete",
    "Create",
    "ReplaceDaemon",
    "DeleteDaemonSet",
    "RecountBudget",
)
"""Steps by name: a SetRole is a promotion (to active) or a demotion (to standby); an
ApplyDaemonSet of the GPU holder is ApplyGpuHolder."""


def step(action: Action) -> str:
    if isinstance(action, SetRole):
        return "promote" if action.role == "active" else "demote"
    if isinstance(action, ApplyDaemonSet) and action.holder:
        return "ApplyGpuHolder"
    return type(action).__name__


def in_order(actions: Iterable[Action]) -> list[Action]:
    """``actions`` in ``ORDER``; actions of one step keep the order they were planned in."""
    return sorted(actions, key=lambda a: ORDER.index(step(a)))
