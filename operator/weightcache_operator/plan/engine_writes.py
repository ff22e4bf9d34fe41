"""The engine actions of one pass (actions.py), as scaling.py and ``failover.plan_replica`` emit
them: one object both planners write through, so relabels, deletions and creations are actions
from the moment they are decided — no plan type of its own to translate afterwards.

It keeps what the actions decided so far imply for the next decision: the role each pod was
given (a group's pods follow their leader), the units being deleted, the nodes new pods went to
(with ``gpuAccess: dra``, engines spread over nodes) and the rendezvous ports new groups took.
Pure: nothing is sent; executor.py carries the actions out in ``actions.ORDER``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping

from weightcache_operator.objects import Object, PodView
from weightcache_operator.plan.actions import Action, Create, Delete, Failover, Promotion, SetRole
from weightcache_operator.plan.engine_units import Unit
from weightcache_operator.plan.placement import new_engine
from weightcache_operator.render.engine import DIST_PORT, DIST_PORT_ANNOTATION, Member, Role
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import GROUP_LABEL


class EngineWrites:
    """Writes for the units ``engines`` (terminating ones included) of ``cache``. ``ready[k]``:
    node → current Ready daemon pod for the nodes holding slot ``k``; new pods go only to those
    not ``cordoned`` (a drain would evict them); ``new_group``: a new engine group's id."""

    def __init__(
        self,
        cache: WeightCache,
        engines: list[Unit],
        ready: Mapping[int, Mapping[str, Object]],
        new_group: Callable[[], str],
        cordoned: Collection[str] = frozenset(),
    ) -> None:
        self.cache = cache
        self.actions: list[Action] = []
        pods = [pod for unit in engines for pod in unit.pods]
        self._load = Counter(PodView(p).node for p in pods if not PodView(p).deleting)
        # Terminating groups included: their ranks hold the port until they exit, a preStop sleep
        # and a drain after the deletion.
        self._ports = {port_of(p) for p in pods}
        self._placeable = {k: {n: d for n, d in nodes.items() if n not in cordoned} for k, nodes in ready.items()}
        self._new_group = new_group
        self._roles: dict[str, str] = {}
        """Pod name → the role these writes give it (the pods themselves are left as given)."""
        self._deleted: set[str] = set()
        """Keys of the units these writes delete."""

    def role_of(self, unit: Unit) -> str | None:
        return self._roles.get(unit.name, unit.role)

    def relabel(self, unit: Unit, role: str) -> None:
        """Every live pod of the unit gets ``role``, each relabelled only where it differs."""
        for pod in map(PodView, unit.pods):
            if pod.deleting:
                continue
            if self._roles.get(pod.name, pod.role) != role:
                self.actions.append(SetRole(pod.name, role))
            self._roles[pod.name] = role

    def promote(self, unit: Unit, promotion: Promotion) -> None:
        """The unit becomes its replica's active. Every promotion is a Failover action, with or
        without a failure: the reporter records, counts and posts only those over a failure, and
        logs a swap for an active that never got Ready, so no promotion goes unlogged."""
        self.relabel(unit, "active")
        self.actions.append(Failover(promotion))

    def delete(self, unit: Unit, why: str) -> None:
        """The unit goes whole: each of its pods not being deleted yet."""
        self._deleted.add(unit.key)
        self.actions.extend(Delete(PodView(p).name, why) for p in unit.pods if not PodView(p).deleting)

    def deleted(self, unit: Unit) -> bool:
        return unit.key in self._deleted

    def new_unit(self, replica: int, role: Role) -> None:
        """A new unit of ``replica``: once every slot it needs has a placeable Ready daemon, its
        pod, or a group's leader (its other ranks follow: ``add_ranks``)."""
        size = self.cache.spec.parallelism.nodes
        if not all(self._placeable.get(k) for k in range(size)):
            return
        if size == 1:
            self._create(replica, role)
            return
        # A group's rendezvous port: the lowest no group of the cache holds (pods sharing a
        # network namespace would collide on one; a follower could even join the wrong group).
        port = next(p for p in range(DIST_PORT, DIST_PORT + 10_000) if p not in self._ports)
        self._ports.add(port)
        self._create(replica, role, Member(self._new_group(), 0, port=port))

    def add_ranks(self, unit: Unit) -> None:
        """A group's missing ranks, against its leader once the leader has a pod IP: the other
        node ranks dial the leader's rendezvous at that address."""
        leader = unit.leader
        ip = (leader.get("status") or {}).get("podIP") if leader is not None else None
        if leader is None or not ip or unit.deleting:
            return
        group = PodView(leader).labels.get(GROUP_LABEL, "")
        role: Role = "active" if self.role_of(unit) == "active" else "standby"
        for rank in range(1, self.cache.spec.parallelism.nodes):
            if rank not in unit.members:
                self._create(int(unit.replica), role, Member(group, rank, ip, port_of(leader)))

    def _create(self, replica: int, role: Role, member: Member | None = None) -> None:
        rank = member.node_rank if member is not None else 0
        pod = new_engine(self.cache, replica, role, self._placeable.get(rank, {}), self._load, member)
        if pod is not None:
            self.actions.append(Create(pod))


def port_of(pod: Object) -> int:
    """The rendezvous port of the group ``pod`` belongs to."""
    text = (pod["metadata"].get("annotations") or {}).get(DIST_PORT_ANNOTATION, "")
    return int(text) if text.isdigit() else DIST_PORT
