"""Scaling and failover for engines of any size, one pass: engine pods in, actions (create,
delete, relabel, failover) out, written through one ``EngineWrites`` (engine_writes.py) by this
module and ``failover.plan_replica`` alike. Pure, so every rule is unit-tested without an API
server; executor.py carries the actions out (engine_plan.py puts them in ``actions.ORDER``).

An engine is a unit (engine_units.py): one pod with ``parallelism.nodes = 1``, a group of
``nodes`` pods otherwise — a single-pod engine is a group of one. Each replica gets exactly one
active unit and ``standbysPerReplica`` standby units, decided by ``failover.plan_replica``;
this module adds what the shape of a unit asks for:

- a unit that does not fit the spec (a scaled-down replica, a pod of the other size, a stale
  ResourceClaim) is deleted whole;
- a group is created leader first: the other node ranks dial the leader's rendezvous at its pod
  IP, which exists only once the leader pod is running, so they are created in a later pass (the
  leader's pod event triggers it), against the same leader, with the unit's role;
- a new unit starts only once every slot it needs has a Ready daemon of the current generation
  (with ``nodes = 1`` slot 0 is every node), so an engine never waits on a daemon that is not
  there, and a group never starts with a rank that has nowhere to go.

Units the rollout holds (its surge units, ``Unit.held``) are neither counted nor trimmed here;
their missing ranks are still created.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from datetime import datetime

from weightcache_operator.objects import Object, PodView
from weightcache_operator.plan.actions import Action
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.engine_writes import EngineWrites
from weightcache_operator.plan.failover import plan_replica
from weightcache_operator.render.dra import engine_claim_current
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import GROUP_LABEL


def plan_scaling(
    cache: WeightCache,
    engines: list[Unit],
    ready: Mapping[int, Mapping[str, Object]],
    new_group: Callable[[], str],
    unready_nodes: Mapping[str, datetime | None] | None = None,
    unresponsive: Mapping[str, datetime] | None = None,
    surge: list[int] | None = None,
    cordoned: Collection[str] = frozenset(),
) -> tuple[list[Action], list[str]]:
    """The actions for the units ``engines`` (terminating ones included; ``held`` ones are the
    rollout's surge units) and the replicas left stranded (an active failed with no Ready standby
    to take over: the Degraded condition). ``ready[k]``: node → current Ready daemon pod, for the
    nodes holding slot ``k``; ``unready_nodes``: as failures.unready_nodes; ``unresponsive``:
    engines the operator's own probes found silent; ``surge``: replicas that get a new surge unit
    (a standby of the new version) from the rollout; ``cordoned``: unschedulable nodes, where
    no new pod goes (a drain would evict it) and an active hands over (failover.plan_replica)."""
    spec = cache.spec.engine
    size = cache.spec.parallelism.nodes
    writes = EngineWrites(cache, engines, ready, new_group, cordoned)
    mine: dict[int, list[Unit]] = {}
    removed: dict[int, list[tuple[Unit, str]]] = {}
    for unit in engines:
        why = _misfit(unit, spec.replicas, size, ready)
        if why is not None:
            writes.delete(unit, why)
            if unit.replica.isdigit():
                removed.setdefault(int(unit.replica), []).append((unit, why))
            continue
        if not unit.deleting:
            writes.relabel(unit, writes.role_of(unit) or "standby")  # a group's pods follow their leader's role
        if unit.held:
            writes.add_ranks(unit)
            continue
        mine.setdefault(int(unit.replica), []).append(unit)

    for replica in surge or []:
        writes.new_unit(replica, "standby")
    stranded: list[str] = []
    for replica in range(spec.replicas):
        why_stranded = plan_replica(
            replica,
            mine.get(replica, []),
            spec.standbys_per_replica,
            daemon_spec_hash(cache),
            unready_nodes or {},
            unresponsive,
            removed.get(replica, ()),
            cordoned,
            writes=writes,
        )
        if why_stranded:
            stranded.append(why_stranded)
    return writes.actions, stranded


def _misfit(unit: Unit, replicas: int, size: int, ready: Mapping[int, Mapping[str, Object]]) -> str | None:
    """Why a unit must go whole whatever its role, or None."""
    if not unit.replica.isdigit():
        return "no replica label"
    if int(unit.replica) >= replicas:
        return "scaled down"
    if size > 1 and unit.key.startswith("pod/"):
        return "not a member of an engine group"
    if size == 1 and GROUP_LABEL in PodView(unit.head).labels:
        return "part of a multi-node engine; parallelism.nodes is 1 now"
    for slot, pod in unit.members.items():
        node = PodView(pod).node
        daemon = ready.get(slot, {}).get(node) if node else None
        if daemon is not None and not PodView(pod).deleting and not engine_claim_current(pod, daemon):
            return "its node's daemon was replaced: the engine's ResourceClaim is stale"
    return None
