"""Engine and daemon pods as rollout scenarios name them (an engine of a template version on a daemon
generation, a daemon holding a generation), the caches' desired state, and what a planned rollout did."""

from __future__ import annotations

from typing import Any

import builders
from weightcache_operator.plan.actions import DeleteDaemonSet, ReplaceDaemon
from weightcache_operator.plan.rollout.decisions import Plan
from weightcache_operator.plan.rollout.views import Desired
from weightcache_operator.render import SPEC_HASH_LABEL

WANT = Desired(engine_hash="new", daemon_hash="g1", replicas=2, standbys=1, ready_deadline_s=60)


def engine(
    name: str,
    replica: int,
    role: str,
    version: str = "new",
    generation: str = "g1",
    *,
    ready: bool = True,
    ready_after_s: float | None = None,
    node: str = "node-1",
    age_s: float = 10,
    deleting: bool = False,
) -> dict[str, Any]:
    """builders.engine as these scenarios name it: an engine of template ``version`` mapping the
    daemon generation ``generation`` (labelled with it too, as rendered), created ``age_s`` before
    NOW, Ready (``ready_after_s`` after its creation when given) unless ``ready`` is False, and
    being deleted since NOW when ``deleting``."""
    return builders.engine(
        name,
        replica=replica,
        role=role,
        engine_hash=version,
        spec_hash=generation,
        labels={SPEC_HASH_LABEL: generation},
        node=node,
        created=-age_s,
        deleted=0 if deleting else None,
        ready=ready,
        ready_since=None if ready_after_s is None else ready_after_s - age_s,
    )


def daemon(name: str, node: str, generation: str = "g1", *, ready: bool = True, **fields: Any) -> dict[str, Any]:
    """builders.daemon as these scenarios name it: the daemon ``name`` on ``node`` holding
    ``generation``, Ready unless ``ready`` is False; the rest as ``builders.pod`` takes it."""
    return builders.daemon(name, node=node, spec_hash=generation, ready=ready, **fields)


DAEMONS = [daemon("d1", "node-1"), daemon("d2", "node-2")]


def old_pair(replica: int, version: str = "old") -> list[dict[str, Any]]:
    return [engine(f"a{replica}", replica, "active", version), engine(f"s{replica}", replica, "standby", version)]


def daemon_replaced(result: Plan) -> str | None:
    """The daemon pod the rollout deletes for its DaemonSet to replace, if any (at most one a pass)."""
    [name] = [a.pod for a in result.actions if isinstance(a, ReplaceDaemon)] or [None]
    return name


def daemonsets_deleted(result: Plan) -> list[str]:
    """The old generation's DaemonSets the rollout deletes in this pass."""
    return [a.name for a in result.actions if isinstance(a, DeleteDaemonSet)]


def held(result: Plan) -> set[str]:
    """The units (by head pod) the rollout hands to scaling as held: neither counted nor trimmed."""
    return {unit.name for unit in result.units if unit.held}


GEN = Desired(engine_hash="new", daemon_hash="g2", replicas=1, standbys=1, ready_deadline_s=60)
