"""The rollout's decisions of one pass (``Plan``), its writes as actions, and the stall that stops them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from weightcache_operator.plan.actions import Action, Delete, SetRole
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.rollout.views import Desired, EngineView

RolloutPhase = Literal["Progressing", "Stalled", "Complete"]


@dataclass
class Plan:
    """The rollout's decisions of one pass: its writes as ``actions`` (relabels active, the
    Service, drains, a daemon pod, old DaemonSets), the surge units scaling renders (``create``),
    the units scaling plans over (``units``), and the report."""

    serve_hash: str
    switching: bool = False
    """The Service moves to ``serve_hash`` in this pass, or moved less than
    ``SWITCH_SETTLE_SECONDS`` ago: the old generation's engines are not retired yet. The
    EndpointSlice controller and every proxy learn of the switch only after the patch, and an
    engine deleted now closes its listener at once, refusing the requests still routed to it
    meanwhile (seen in the group blue/green e2e)."""
    actions: list[Action] = field(default_factory=list)
    """The rollout's writes, in ``actions.ORDER`` once ``plan`` returns. A promoted or retired
    unit's action names every pod of it, its head pod first."""
    create: list[int] = field(default_factory=list)
    """Replicas that get a new-version standby (a surge unit), which scaling renders and creates."""
    units: list[Unit] = field(default_factory=list)
    """The engine units as ``actions`` leave them (copies), what scaling plans over; the surge
    units are ``Unit.held``: scaling must neither count nor trim them."""
    mode: Literal["Engine", "Generation"] | None = None
    phase: RolloutPhase | None = None
    step: str = ""
    updated: int = 0
    stalled: str | None = None
    """Why the rollout stopped, when it did."""


def promote(result: Plan, unit: EngineView) -> None:
    """Relabels every pod of ``unit`` active."""
    result.actions += [SetRole(name, "active") for name in unit.pods]


def retire(result: Plan, units: list[EngineView]) -> None:
    """Deletes every pod of ``units`` with its grace period (it drains), each once."""
    retiring = retired(result)
    result.actions += [Delete(name, "rolled out") for unit in units for name in unit.pods if name not in retiring]


def promoted(result: Plan) -> list[str]:
    """The pods the rollout relabels active in this pass."""
    return [a.name for a in result.actions if isinstance(a, SetRole) and a.role == "active"]


def retired(result: Plan) -> list[str]:
    """The pods the rollout deletes in this pass."""
    return [a.name for a in result.actions if isinstance(a, Delete)]


def check_deadline(want: Desired, pod: EngineView, now: datetime, result: Plan, group: bool = False) -> None:
    """Stalls ``result`` when ``pod`` (a group's view with ``group``) of the new version is not
    Ready ``readyDeadlineSeconds`` after its creation, saying which and what to do."""
    if pod.created is None:
        return
    waited = (now - pod.created).total_seconds()
    if waited > want.ready_deadline_s:
        what, logs = (f"engine group {pod.name}", "the group's pods") if group else (pod.name, "the pod")
        result.stalled = (
            f"{what} of the new version was not Ready {waited:.0f}s after its creation"
            f" (engine.rollout.readyDeadlineSeconds is {want.ready_deadline_s:g}); the old version keeps"
            f" serving. Fix the engine template (kubectl logs {logs}) or change it back, and the rollout resumes"
        )
