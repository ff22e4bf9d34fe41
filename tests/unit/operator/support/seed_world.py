"""What seeding's tests plan on (plan/seeding.py): a cache's daemon pods on GPU nodes, each with
the report its status endpoint gave, gathered into a pass's snapshot and the reports the daemon
status reader holds (by pod uid)."""

from __future__ import annotations

import copy
from typing import Any

from builders import BASE, daemon, make, node
from daemon_reports import rank, report
from weightcache_contract.daemon_report import DaemonReport
from weightcache_operator.observe.daemon_status import Fetched
from weightcache_operator.observe.snapshot import Snapshot
from weightcache_operator.render.layout import daemon_spec_hash
from weightcache_operator.spec import WeightCache

CACHE = make()
"""Two ranks, every selected node (label pool=gpu) holding both."""
CURRENT = daemon_spec_hash(CACHE)


def full() -> DaemonReport:
    """A ready report of both ranks, each with its weights digest."""
    return report(rank(0), rank(1))


def seed_daemon(at: str, ip: str, *, ready: bool = True, spec_hash: str = CURRENT) -> dict[str, Any]:
    """``at``'s daemon pod of generation ``spec_hash``, Ready or not, at ``ip``."""
    return daemon(node=at, spec_hash=spec_hash, ip=ip, ready=ready)


def gpu_nodes(*names: str, cordoned: tuple[str, ...] = (), unready: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Ready nodes labelled pool=gpu; those in ``cordoned`` cordoned, those in ``unready`` not Ready."""
    return [
        node(n, labels={"pool": "gpu"}, ready=n not in unready, unschedulable=True if n in cordoned else None)
        for n in names
    ]


def world(
    daemons: list[tuple[dict[str, Any], Fetched]],
    nodes: list[dict[str, Any]],
    *,
    cache: WeightCache = CACHE,
    peers: dict[str, Any] | None = None,
) -> tuple[Snapshot, dict[str, Fetched]]:
    """The snapshot of ``daemons`` (each pod with its report) on ``nodes`` and the live peers
    ConfigMap ``peers``; and the reports by pod uid."""
    body = copy.deepcopy(BASE)
    snapshot = Snapshot(
        body,
        cache,
        nodes=list(nodes),
        daemon_pods=[pod for pod, _ in daemons],
        seed_peers=peers,
    )
    return snapshot, {pod["metadata"]["uid"]: fetched for pod, fetched in daemons}
