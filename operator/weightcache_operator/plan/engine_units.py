"""Engines as units: one pod with ``parallelism.nodes = 1``, a group of ``nodes`` pods otherwise.

Roles, readiness and failover apply to whole units: the pods of an engine group share the
``weightcache.io/engine-group`` and ``weightcache.io/role`` labels, and a group is Ready only
when every node rank has its pod and all of them are Ready. Pure: pods in, facts out.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from weightcache_operator.objects import Object, pod_ready
from weightcache_operator.vocabulary import GROUP_LABEL, NODE_RANK_LABEL, REPLICA_LABEL, ROLE_LABEL


@dataclass
class Unit:
    """One engine: its pods by node rank (0, the leader, serves HTTP)."""

    key: str
    replica: str
    members: dict[int, Object] = field(default_factory=dict)
    size: int = 1
    held: bool = False
    """A rollout's surge unit (``units``' ``held``): scaling neither counts nor trims it, and
    still creates its missing ranks."""

    @property
    def leader(self) -> Object | None:
        return self.members.get(0)

    @property
    def pods(self) -> list[Object]:
        return [self.members[k] for k in sorted(self.members)]

    @property
    def head(self) -> Object:
        """The pod that speaks for the unit: its leader, or while it has none its first member."""
        return self.leader or self.pods[0]

    @property
    def name(self) -> str:
        """The leader's pod name names the unit (what ``status.engines`` lists)."""
        return str(self.head["metadata"]["name"])

    @property
    def role(self) -> str | None:
        return (self.head["metadata"].get("labels") or {}).get(ROLE_LABEL)

    @property
    def complete(self) -> bool:
        return sorted(self.members) == list(range(self.size))

    @property
    def ready(self) -> bool:
        return self.complete and all(pod_ready(p) for p in self.pods)

    @property
    def deleting(self) -> bool:
        return any(p["metadata"].get("deletionTimestamp") for p in self.pods)

    @property
    def created(self) -> str:
        return str(self.head["metadata"].get("creationTimestamp") or "")

    @property
    def lost(self) -> str | None:
        """Why the unit can never serve again while none of it is being deleted: a pod of it
        exited for good, or (a group) its leader is gone — the other ranks dial the leader."""
        for pod in self.pods:
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Failed", "Succeeded"):
                return f"{pod['metadata']['name']} is {phase}"
        return None if self.leader is not None else "the group's leader is gone"


def units(pods: list[Object], nodes: int, held: Collection[str] = frozenset()) -> list[Unit]:
    """Groups engine pods into units, in a stable order. With ``nodes = 1`` every pod is its own
    unit; otherwise pods are grouped by their group label (a pod without one is its own, broken
    unit, so the caller can remove it). A unit with a pod named in ``held`` is ``held``."""
    found: dict[str, Unit] = {}
    for pod in pods:
        labels = pod["metadata"].get("labels") or {}
        replica = labels.get(REPLICA_LABEL, "")
        group = labels.get(GROUP_LABEL) if nodes > 1 else None
        rank = labels.get(NODE_RANK_LABEL, "0") if group else "0"
        key = f"{replica}/{group}" if group else f"pod/{pod['metadata']['name']}"
        unit = found.setdefault(key, Unit(key=key, replica=replica, size=nodes))
        if not rank.isdigit() or int(rank) in unit.members or int(rank) >= unit.size:
            # A duplicate or out-of-range member: its own unit, which is then incomplete.
            unit = found.setdefault(
                f"pod/{pod['metadata']['name']}", Unit(f"pod/{pod['metadata']['name']}", replica, size=nodes)
            )
            unit.members[-1] = pod
            continue
        unit.members[int(rank)] = pod
    for unit in found.values():
        unit.held = any(p["metadata"]["name"] in held for p in unit.pods)
    return sorted(found.values(), key=lambda u: u.key)
