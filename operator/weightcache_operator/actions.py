"""What a pass does to the cluster for its engines, as values: the planners (engine_plan.py)
return them, the executor (executor.py) carries them out in ``ORDER``.

``ORDER`` is what keeps the Service serving through every change: endpoints are added before
the Service changes and removed after it. Engines are relabelled active first (a promoted standby
joins the Service's endpoints), then the failovers are recorded, then the Service is applied
(switching daemon spec hash when the plan says so), then engines are relabelled standby (a
demoted active leaves the endpoints only once the Service selects its successor: in a blue/green
switch the old active is demoted in the very pass the Service moves away from it), and only then
are pods deleted — each with its grace period, so in-flight requests finish — and new ones
created; daemons and old DaemonSets, which engines map, go last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .failover import Promotion
from .objects import Object


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
    """Blue/green's end: delete the drained old generation's DaemonSet (its pods and arenas go with it)."""

    name: str


Action = SetRole | Failover | ApplyService | Delete | Create | ReplaceDaemon | DeleteDaemonSet

ORDER: tuple[str, ...] = (
    "promote",
    "Failover",
    "ApplyService",
    "demote",
    "Delete",
    "Create",
    "ReplaceDaemon",
    "DeleteDaemonSet",
)
"""Steps by name: a SetRole is a promotion (to active) or a demotion (to standby)."""


def step(action: Action) -> str:
    if isinstance(action, SetRole):
        return "promote" if action.role == "active" else "demote"
    return type(action).__name__


def in_order(actions: Iterable[Action]) -> list[Action]:
    """``actions`` in ``ORDER``; actions of one step keep the order they were planned in."""
    return sorted(actions, key=lambda a: ORDER.index(step(a)))
