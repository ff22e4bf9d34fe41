"""Failover decisions for one engine replica: its engine units (one pod, or a group of
``parallelism.nodes`` pods: engine_units.py) as the API server shows them → what to do. One
planner for every engine size: a single-pod engine is a group of one.

Pure: no API calls and no clock, so every signal and every half-finished failover (an operator
killed between two patches) is a unit test. The plan is actions (actions.py), written through the
pass's ``EngineWrites`` (engine_writes.py) as they are decided; executor.py carries them out in
the order that keeps the Service serving (actions.ORDER): promote the standby first, then retire
the failed active, then create what is missing.

A plan is computed from the current state alone. An operator that restarts mid-failover sees
either the old roles (and decides the same promotion again) or the new ones (two actives, or an
active without its standby) and finishes the job; nothing depends on remembering a decision.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Any

from weightcache_operator.objects import Object, PodView, spec_hash, truncated
from weightcache_operator.observe.failures import Failure, failure_of
from weightcache_operator.plan.actions import Promotion
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.engine_writes import EngineWrites
from weightcache_operator.spec import FailoverStatus


def unit_failure(
    unit: Unit,
    unready_nodes: Mapping[str, datetime | None],
    unresponsive: Mapping[str, datetime] | None = None,
    cordoned: Collection[str] = frozenset(),
) -> Failure | None:
    """The failure of an engine unit: the first of its pods' failures, leader first (a unit of
    one: its pod's). A group cannot serve with any rank failed, so one failed pod fails it."""
    members = sorted(unit.members.items(), key=lambda kv: (kv[0] < 0, kv[0]))
    return next(
        (f for _, p in members if (f := failure_of(p, unready_nodes, unresponsive, cordoned)) is not None), None
    )


def on_cordoned(unit: Unit, cordoned: Collection[str]) -> bool:
    """Whether any pod of the unit runs on a cordoned node (a drain takes the whole unit)."""
    return any(PodView(p).node in cordoned for p in unit.pods)


def plan_replica(
    replica: int,
    found: list[Unit],
    standbys_wanted: int,
    current_hash: str,
    unready_nodes: Mapping[str, datetime | None],
    unresponsive: Mapping[str, datetime] | None = None,
    removed: Sequence[tuple[Unit, str]] = (),
    cordoned: Collection[str] = frozenset(),
    *,
    writes: EngineWrites,
) -> str | None:
    """Plans one replica's engine units (engine_units.py: one pod, or a group of
    ``parallelism.nodes`` pods), terminating ones included: a deleted active is the failure that
    names itself. ``unresponsive``: see ``failure_of`` (a group answers through its leader); a
    standby that does not answer never takes over, and an active that does not answer is
    demoted, not deleted. ``removed``: units of the replica the caller deletes for reasons of
    its own (scaled down, a stale claim), with why: a removed active is a failed one.
    ``cordoned``: unschedulable nodes; an active there (a group: any pod) hands over to a Ready
    standby elsewhere and is demoted, so a drain can evict it; a standby there is promoted last.

    Promotion picks, among standbys mapping the failed active's weights (its daemon spec hash;
    the current one when there is no failed unit to read it from) and not failed themselves, a
    Ready one on the failed active's node first (same daemon, same arena), then any Ready one;
    the oldest wins ties so two passes pick the same unit. With none Ready, the failed active
    stays (the best there is) unless it is gone for good, in which case a still starting standby
    is promoted — it will serve before a unit created now would.

    The actions go to ``writes`` as they are decided (engine_plan.py puts them in
    ``actions.ORDER``: promote, demote, delete, create); groups missing ranks get them last but
    for new units. Returns why the replica is stranded (its active failed and no standby could
    take over: the cache is Degraded), None when it is not."""
    stranded: str | None = None
    create_active = False
    demoted: list[Unit] = []

    def demote(unit: Unit) -> None:
        """Relabelled standby: a surplus active, or an active that never got Ready."""
        writes.relabel(unit, "standby")
        demoted.append(unit)
        standbys.append(unit)

    live = [u for u in found if not u.deleting]
    for unit in found:
        if unit.deleting and any(not p["metadata"].get("deletionTimestamp") for p in unit.pods):
            # A group with a pod being deleted cannot serve: its other pods go with it.
            writes.delete(unit, "another pod of its engine group is being deleted")
    serving = []
    for unit in live:
        lost = unit.lost
        if lost is not None:
            writes.delete(unit, lost)
        else:
            serving.append(unit)
    silent = unresponsive or {}
    serving.sort(key=lambda u: (not u.ready, u.name in silent, on_cordoned(u, cordoned), u.created, u.name))
    actives = [u for u in serving if u.role == "active"]
    standbys = [u for u in serving if u.role != "active"]
    # Surplus actives (an operator stopped between a promotion and the retirement): keep the
    # Ready, oldest one; retire the failed ones as the interrupted failover would have.
    for extra in actives[1:]:
        failure = unit_failure(extra, unready_nodes, unresponsive, cordoned)
        if failure is None or not failure.retire:
            demote(extra)
        else:
            writes.delete(extra, f"failed ({failure.signal}): {failure.detail}")
    active = actives[0] if actives else None

    failed: Unit | None
    if active is not None:
        failed, failure = active, unit_failure(active, unready_nodes, unresponsive, cordoned)
        trouble = failure is not None or not active.ready
    else:
        # No live active: the failure is the most recent active that is gone, lost or removed.
        kept = {id(u) for u in serving}
        why_removed = {id(u): why for u, why in removed}
        gone = sorted(
            [
                *(u for u in found if u.role == "active" and id(u) not in kept),
                *(u for u, _ in removed if u.role == "active"),
            ],
            key=lambda u: u.created,
        )
        failed = gone[-1] if gone else None
        failure = unit_failure(failed, unready_nodes, unresponsive, cordoned) if failed else None
        if failed is not None and failure is None and id(failed) in why_removed:
            failure = Failure("PodGone", None, f"{failed.name}: {why_removed[id(failed)]}", True)
        trouble = True

    if trouble:
        # The weights the failed active served: during a generation change the Service still
        # selects the old generation, and an old-generation standby is what can take over there.
        weights = (spec_hash(failed.head) if failed is not None else None) or current_hash
        candidates = [
            u
            for u in standbys
            if all(u is not d for d in demoted) and _may_take_over(u, weights, unready_nodes, unresponsive, cordoned)
        ]
        node = PodView(failed.head).node if failed is not None else None
        candidates.sort(
            key=lambda u: (not u.ready, on_cordoned(u, cordoned), PodView(u.head).node != node, u.created, u.name)
        )
        best = candidates[0] if candidates else None
        # A starting standby takes over only from an active gone for good: it serves sooner than
        # a unit created now, while an active that may recover is still the best there is. From
        # an active on a cordoned node only a standby off cordoned nodes: the drain takes the other too.
        drained = failure is not None and failure.signal == "NodeCordoned"
        take_over = (
            best is not None
            and (best.ready or active is None or (failure is not None and failure.final))
            and not (drained and on_cordoned(best, cordoned))
        )
        if take_over:
            assert best is not None
            if active is None and failure is None:
                # The active vanished while no operator watched (deleted and gone before a restart):
                # still a failover, with no timestamp to measure detection from.
                failure = Failure("PodGone", None, f"replica {replica} has no active engine", True)
            writes.promote(
                best,
                Promotion(
                    replica, best.head, failed.head if failed else None, failure, tuple(failed.pods) if failed else ()
                ),
            )
            standbys.remove(best)
            if active is not None:
                # Deleted (a group whole) and replaced rather than kept as a standby: a failed
                # unit may fail again as the replica's only standby, a fresh one is known good.
                if failure is None or not failure.retire:  # never Ready yet, or maybe only slow
                    demote(active)
                else:
                    writes.delete(active, f"failed ({failure.signal}): {failure.detail}")
            if not best.ready:
                stranded = f"replica {replica}: promoted {best.name}, which is not Ready yet"
        elif active is None:
            create_active = True
            if failure is not None:
                stranded = f"replica {replica}: active engine failed ({failure.detail}) and no standby exists"
        elif failure is not None and drained:
            assert active is not None
            stranded = (
                f"replica {replica}: {failure.detail}, and no Ready standby on a schedulable node can take "
                f"over: {active.name} keeps serving and its eviction (kubectl drain) waits until one is Ready "
                "(the cache's PodDisruptionBudget admits none). Standbys start only on schedulable nodes with "
                "a Ready daemon; if there is none, uncordon the node or add one"
            )
        elif failure is not None:
            stranded = (
                f"replica {replica}: active engine failed ({failure.detail}) and no Ready standby can "
                "take over; keeping it"
            )

    standbys.sort(key=lambda u: (not u.ready, u.created, u.name))
    for extra in standbys[standbys_wanted:][::-1]:
        writes.delete(extra, "too many standbys")
    for unit in found:
        if not writes.deleted(unit):
            writes.add_ranks(unit)
    if create_active:
        writes.new_unit(replica, "active")
    for _ in range(standbys_wanted - len(standbys)):
        writes.new_unit(replica, "standby")
    return stranded


def _may_take_over(
    unit: Unit,
    weights: str,
    unready_nodes: Mapping[str, datetime | None],
    unresponsive: Mapping[str, datetime] | None,
    cordoned: Collection[str],
) -> bool:
    """A standby may become active only while it maps the same weights as the active it
    replaces (the same daemon spec hash: never another model behind the Service) and has not
    failed itself (answering its readiness endpoint included); one on a cordoned node serves as
    well as any, and is ranked last."""
    failure = unit_failure(unit, unready_nodes, unresponsive, cordoned)
    return spec_hash(unit.head) == weights and (failure is None or failure.signal == "NodeCordoned")


def failover_status(
    promotion: Promotion, noticed: datetime, promoted: datetime, seen: datetime | None
) -> FailoverStatus:
    """``status.lastFailover`` for a promotion, every duration on the operator's own clock:
    ``noticed``, the start of the pass that acted; ``promoted``, when its relabel was patched;
    ``seen``, the operator's first sight of the failure (sightings.py; None: never seen failing).
    Only what is known is set (``FailoverStatus.whole`` sets the rest when it is written).

    Detection runs from ``seen`` to ``noticed``, never from the failure's API timestamp: that is
    truncated to the second, so "API stamp → noticed" reads up to a second more than the operator
    took (a deletion at .9 s stamped .0). The stamp is kept apart, as whole seconds, in
    ``failureApiSecond``."""
    failure = promotion.failure
    entry: dict[str, Any] = {
        "time": truncated(noticed, "microseconds"),
        "replica": promotion.replica,
        "to": _name(promotion.promoted),
        "to_node": promotion.promoted.get("spec", {}).get("nodeName"),
        "promotion_ms": round((promoted - noticed).total_seconds() * 1000, 1),
    }
    if promotion.failed is not None:
        entry["from_"] = _name(promotion.failed)
        entry["from_node"] = promotion.failed.get("spec", {}).get("nodeName")
    if failure is not None:
        entry["signal"] = failure.signal
        entry["reason"] = failure.detail[:1024]
        if seen is not None:
            # Never negative (the CRD says ge=0): a pass records its own start as a sighting.
            entry["detection_ms"] = max(0.0, round((noticed - seen).total_seconds() * 1000, 1))
        if failure.since is not None:
            entry["failure_api_second"] = truncated(failure.since)
    return FailoverStatus(**{k: v for k, v in entry.items() if v is not None})


def _name(pod: Object) -> str:
    return PodView(pod).name
