"""One replica's failover plan (``failover.plan_replica``) over single-pod engines of the
generation HASH, read back from the actions it writes, and the running engine pods its scenarios
start from."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import count
from typing import Any

from builders import daemon, engine, make
from weightcache_operator.objects import PodView
from weightcache_operator.plan.actions import Action, Create, Delete, Failover, Promotion, SetRole
from weightcache_operator.plan.engine_units import Unit, units
from weightcache_operator.plan.engine_writes import EngineWrites
from weightcache_operator.plan.failover import plan_replica as plan_of_replica

HASH = "h1"

running_engine = partial(
    engine, spec_hash=HASH, gate="True", phase="Running", created=0, started=1, ready=True, ready_since=5
)
"""An engine pod of replica 0 on node-1 as the API shows it: created at NOW, its container running
since NOW+1, Ready and its daemon-ready gate True since NOW+5."""


DAEMONS = {0: {n: daemon(node=n, spec_hash=HASH) for n in ("node-1", "node-2", "node-9")}}
"""Ready daemons where new engines may go: node-9 runs no engine in these tests, so a creation
is never refused for want of a node (a cordon of node-1 included)."""


@dataclass
class Planned:
    """What ``failover.plan_replica`` wrote for one replica, read back from its actions."""

    actions: list[Action]
    stranded: str | None

    @property
    def promotion(self) -> Promotion | None:
        return next((a.promotion for a in self.actions if isinstance(a, Failover)), None)

    @property
    def demote(self) -> list[str]:
        return [a.name for a in self.actions if isinstance(a, SetRole) and a.role == "standby"]

    @property
    def delete(self) -> list[tuple[str, str]]:
        return [(a.name, a.why) for a in self.actions if isinstance(a, Delete)]

    def created(self, role: str) -> int:
        return sum(1 for a in self.actions if isinstance(a, Create) and PodView(a.pod).role == role)

    @property
    def create_active(self) -> bool:
        return self.created("active") > 0

    @property
    def create_standbys(self) -> int:
        return self.created("standby")


def plan_units(replica: int, found: list[Unit], *args: Any) -> Planned:
    """``plan_replica`` with ``plan_replica``'s positional arguments after the units, its actions
    written through an ``EngineWrites`` that can place new engines (``DAEMONS``)."""
    cordoned = args[5] if len(args) > 5 else frozenset()
    ids = count()
    writes = EngineWrites(make(), found, DAEMONS, lambda: f"g{next(ids)}", cordoned)
    return Planned(writes.actions, plan_of_replica(replica, found, *args, writes=writes))


def plan_replica(replica: int, pods: list[dict[str, Any]], *args: Any) -> Planned:
    """The plan for single-pod engines: each pod a unit of one."""
    return plan_units(replica, units(pods, 1), *args)
