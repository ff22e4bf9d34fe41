"""The rollout's decisions of one pass (``Plan``), and the stall that stops them."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.rollout.views import Desired, EngineView

RolloutPhase = Literal["Progressing", "Stalled", "Complete"]


@dataclass
class Plan:
    """The rollout's decisions of one pass, which engine_plan.py turns into actions, in this
    order (``actions.ORDER``): ``promote``, then
    point the Service at ``serve_hash``, then ``retire``, ``create``, ``replace_daemon``."""

    serve_hash: str
    switching: bool = False
    """The Service moves to ``serve_hash`` in this pass, or moved less than
    ``SWITCH_SETTLE_SECONDS`` ago: the old generation's engines are not retired yet. The
    EndpointSlice controller and every proxy learn of the switch only after the patch, and an
    engine deleted now closes its listener at once, refusing the requests still routed to it
    meanwhile (seen in the group blue/green e2e)."""
    promote: list[str] = field(default_factory=list)
    """Units (their head pods) to relabel active."""
    retire: list[str] = field(default_factory=list)
    """Old units (their head pods) to delete with their grace period (drain)."""
    create: list[int] = field(default_factory=list)
    """Replicas that get a new-version standby (a surge unit)."""
    replace_daemon: str | None = None
    """A drained node's old-generation daemon pod to delete (the DaemonSet recreates it)."""
    retire_daemonsets: list[str] = field(default_factory=list)
    """Blue/green: old-generation DaemonSets whose engines are all gone, to delete (their pods,
    keepers and arenas with them)."""
    mode: Literal["Engine", "Generation"] | None = None
    phase: RolloutPhase | None = None
    step: str = ""
    updated: int = 0
    stalled: str | None = None
    """Why the rollout stopped, when it did."""
    units: list[Unit] = field(default_factory=list)
    """The engine units as ``promote`` and ``retire`` leave them (copies), what scaling plans
    over; the surge units are ``Unit.held``: scaling must neither count nor trim them."""


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
