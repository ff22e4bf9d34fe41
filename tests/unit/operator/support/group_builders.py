"""Builders for engine groups (``parallelism.nodes > 1``): the two-node cache, slot daemons Ready
on their nodes, whole groups, a converged pair of them, the one engine planner's plan for them, and
what that plan does to which pods."""

from __future__ import annotations

import copy
import itertools
from datetime import datetime
from typing import Any

import builders
from builders import NOW, condition, container_status, node, scheduled
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.plan.actions import ApplyService, Failover
from weightcache_operator.plan.engine_plan import EnginePlan, desired, plan_engines
from weightcache_operator.render import SPEC_HASH_ANNOTATION, daemon_spec_hash, engine_pod, engine_service
from weightcache_operator.render.engine import Member

TWO = {"parallelism.tensor": 2, "parallelism.nodes": 2}
"""tensor 2 over 2 nodes: each engine is a group of two pods, one rank per node."""


def daemon(node_name: str, slot: int, **fields: Any) -> dict[str, Any]:
    """The daemon pod of node slot ``slot`` on ``node_name``, the rest as ``builders.daemon`` takes
    it; ``engine_plan`` makes it Ready and of the cache's generation."""
    return builders.daemon(f"d-{node_name}", node=node_name, slot=slot, **fields)


READY = {0: {"node-1": daemon("node-1", 0)}, 1: {"node-2": daemon("node-2", 1)}}
FOUR_NODES = {0: {**READY[0], "node-3": daemon("node-3", 0)}, 1: {**READY[1], "node-4": daemon("node-4", 1)}}
"""READY plus a second node of each slot (node-3, node-4): room for a second group elsewhere."""


def group(
    cache: Any,
    name: str,
    role: str,
    *,
    nodes: tuple[str, str] = ("node-1", "node-2"),
    ready: bool = True,
    created: float = 0,
    replica: int = 0,
) -> list[dict[str, Any]]:
    """A whole engine group of two pods, scheduled on ``nodes`` and created ``created`` seconds
    after NOW, running, Ready or not."""
    ip = f"198.18.{sum(map(ord, name)) % 250}.5"
    leader = engine_pod(cache, replica, role, [nodes[0]], member=Member(name, 0))
    follower = engine_pod(cache, replica, role, [nodes[1]], member=Member(name, 1, ip))
    return [
        scheduled(leader, node=nodes[0], ip=ip, ready=ready, created=created),
        scheduled(follower, node=nodes[1], ip=f"198.18.{sum(map(ord, name)) % 250}.6", ready=ready, created=created),
    ]


def names(actions: list[Any], kind: type, role: str | None = None) -> list[str]:
    """The pod names of the ``kind`` actions (of ``role`` when given), sorted."""
    return sorted(a.name for a in actions if isinstance(a, kind) and (role is None or a.role == role))


def run(pod: dict[str, Any], node_name: str, ip: str | None = None, ready: bool = False) -> dict[str, Any]:
    """A created pod as the API server would return it once scheduled (and running)."""
    return scheduled(pod, node=node_name, ip=ip, ready=ready)


def readiness_failed(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The group's pods, Ready turned False (NOW+300) after their containers had started (NOW+1): ReadinessFailed."""
    out = copy.deepcopy(pods)
    for pod in out:
        pod["status"]["containerStatuses"] = [container_status("engine", started=1)]
        pod["status"]["conditions"] = [condition("Ready", False, since=300)]
    return out


def ids() -> Any:
    counter = itertools.count()
    return lambda: f"g{next(counter)}"


def engine_plan(
    cache: Any,
    pods: list[dict[str, Any]],
    ready: dict[int, dict[str, dict[str, Any]]],
    new_group: Any,
    unready_nodes: dict[str, None] | None = None,
    serving: str | None = None,
    unresponsive: dict[str, datetime] | None = None,
    now: datetime = NOW,
    cordoned: list[str] | tuple[str, ...] = (),
) -> EnginePlan:
    """The one planner's plan for a cache whose slot ``k`` daemons are Ready on the nodes of
    ``ready[k]``, with ``unready_nodes`` NotReady, ``cordoned`` nodes unschedulable and the
    Service on ``serving`` (default: the current generation)."""
    daemons = []
    for slot in ready.values():
        for pod in slot.values():
            pod = copy.deepcopy(pod)
            pod["metadata"]["annotations"] = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
            pod["status"] = {**pod["status"], "conditions": [{"type": "Ready", "status": "True"}]}
            daemons.append(pod)
    nodes = [node(name, ready=False) for name in unready_nodes or {}] + [
        node(name, unschedulable=True, ready=True) for name in cordoned
    ]
    body = {"metadata": {"name": cache.metadata["name"], "namespace": "ns"}, "status": {}}
    state = Snapshot(
        body,
        cache,
        nodes=nodes,
        daemon_pods=daemons,
        engine_pods=list(pods),
        service=engine_service(cache, serving or daemon_spec_hash(cache)),
    )
    return plan_engines(
        cache, state, desired(cache), now, apply_service=False, unresponsive=unresponsive, new_group=new_group
    )


def plan_groups(
    cache: Any,
    pods: list[dict[str, Any]],
    ready: dict[int, dict[str, dict[str, Any]]],
    new_group: Any,
    unready_nodes: dict[str, None] | None = None,
    serving: str | None = None,
) -> list[Any]:
    """``engine_plan``'s engine actions (the Service's left out)."""
    plan = engine_plan(cache, pods, ready, new_group, unready_nodes, serving)
    return [a for a in plan.actions if not isinstance(a, ApplyService)]


def complete_groups(cache: Any, ready_active: bool = True, ready_standby: bool = True) -> list[dict[str, Any]]:
    pods = []
    for group, role, ready in (("ga", "active", ready_active), ("gb", "standby", ready_standby)):
        ip = "198.18.1.5" if group == "ga" else "198.18.1.6"
        pods.append(run(engine_pod(cache, 0, role, ["node-1"], member=Member(group, 0)), "node-1", ip, ready))
        pods.append(
            run(engine_pod(cache, 0, role, ["node-2"], member=Member(group, 1, ip)), "node-2", "198.18.2.5", ready)
        )
    return pods


def failovers(plan: list[Any]) -> list[tuple[str, str | None, str | None]]:
    """(to, from, signal) of each Failover action."""
    return [
        (
            a.promotion.promoted["metadata"]["name"],
            a.promotion.failed["metadata"]["name"] if a.promotion.failed else None,
            a.promotion.failure.signal if a.promotion.failure else None,
        )
        for a in plan
        if isinstance(a, Failover)
    ]
