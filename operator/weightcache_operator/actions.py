"""What a pass does to the cluster for its engines, as values: the planners (engine_plan.py)
return them, the executor (executor.py) carries them out in ``ORDER``.

``ORDER`` is what keeps the Service serving through every change: engines are relabelled first
(a promoted standby joins the Service's endpoints, a demoted active leaves them), then the
failovers are recorded, then the Service is applied (switching generation when the plan says
so), and only then are pods deleted — each with its grace period, so in-flight requests finish —
and new ones created; daemons and old DaemonSets, which engines map, go last.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Union

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
    """Server-side apply the engine Service, selecting the engines of daemon spec hash ``serve``."""

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


Action = Union[SetRole, Failover, ApplyService, Delete, Create, ReplaceDaemon, DeleteDaemonSet]

ORDER: tuple[type, ...] = (SetRole, Failover, ApplyService, Delete, Create, ReplaceDaemon, DeleteDaemonSet)


def in_order(actions: Iterable[Action]) -> list[Action]:
    """``actions`` in ``ORDER``; actions of one kind keep the order they were planned in."""
    return sorted(actions, key=lambda a: ORDER.index(type(a)))
