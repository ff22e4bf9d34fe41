"""The rollout's views: what the spec asks for (``Desired``) and what is observed, one view per
engine unit and per daemon pod, which every decision in this package is made over."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime

from weightcache_operator.objects import Object, PodView
from weightcache_operator.plan.engine_units import Unit, units


@dataclass(frozen=True)
class Desired:
    """What the spec asks for now."""

    engine_hash: str
    """``engine_template_hash``: what the engines run."""
    daemon_hash: str
    """``daemon_spec_hash``: what the daemons hold."""
    replicas: int
    standbys: int
    ready_deadline_s: float
    max_surge: int = 1
    """``spec.engine.rollout.maxSurge``: replicas an engine rollout works on at once."""


@dataclass(frozen=True)
class EngineView:
    """The facts about one engine pod that decisions use."""

    name: str
    replica: int | None
    role: str | None
    engine_hash: str | None
    daemon_hash: str | None
    node: str | None
    ready: bool
    deleting: bool
    created: datetime | None
    pods: tuple[str, ...] = ()
    """The unit's pod names, its head (``name``) first."""

    @classmethod
    def of(cls, raw: Object) -> EngineView:
        pod = PodView(raw)
        return cls(
            name=pod.name,
            replica=pod.replica,
            role=pod.role,
            engine_hash=pod.engine_hash,
            daemon_hash=pod.spec_hash,
            node=pod.node,
            ready=pod.ready,
            deleting=pod.deleting,
            created=pod.created,
            pods=(pod.name,),
        )


@dataclass(frozen=True)
class DaemonView:
    name: str
    node: str | None
    daemon_hash: str | None
    ready: bool
    owner: str | None
    """The DaemonSet the pod belongs to (its controller reference)."""

    @classmethod
    def of(cls, raw: Object) -> DaemonView:
        pod = PodView(raw)
        return cls(name=pod.name, node=pod.node, daemon_hash=pod.spec_hash, ready=pod.ready, owner=pod.owner)


def engine_views(want: Desired, engines: list[Object], size: int) -> list[EngineView]:
    """One view per engine unit, terminating pods included (a draining old engine is not done
    yet). A unit of one is its pod's view, in the order the pods are given (a replica's first
    active among them is the one a single-pod rollout keeps)."""
    if size == 1:
        return [EngineView.of(p) for p in engines]
    return [unit_view(want, u) for u in units(engines, size)]


def unit_view(want: Desired, unit: Unit) -> EngineView:
    """An engine unit as one engine: its head pod's facts, the unit's readiness and deletion, and
    outdated if any of its pods is."""
    hashes = [PodView(p).engine_hash for p in unit.pods]
    return replace(
        EngineView.of(unit.head),
        ready=unit.ready,
        deleting=unit.deleting,
        engine_hash=next((h for h in hashes if h != want.engine_hash), want.engine_hash),
        pods=tuple(PodView(p).name for p in unit.pods),
    )


def replica_done(want: Desired, pods: list[EngineView], replica: int) -> bool:
    """Whether ``replica`` is whole on the new version: nothing outdated left (terminating pods
    included), and a Ready active and ``standbys`` Ready standbys. ``pods``: one view per engine
    (a group's view speaks for all its pods)."""
    mine = [p for p in pods if p.replica == replica]
    if any(p.engine_hash != want.engine_hash for p in mine):
        return False
    live = [p for p in mine if not p.deleting]
    active_ok = any(p.role == "active" and p.ready for p in live)
    return active_ok and sum(p.role != "active" and p.ready for p in live) >= want.standbys


def preference(pod: EngineView) -> tuple[bool, str, str]:
    """Ready first, then the oldest (it has been warming longest)."""
    return (not pod.ready, pod.created.isoformat() if pod.created else "", pod.name)
