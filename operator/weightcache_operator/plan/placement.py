"""Where a new engine pod may run. Pure: ready daemons in, nodes (and a claim) out."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from weightcache_operator.objects import Object
from weightcache_operator.render.dra import daemon_claim, uses_dra
from weightcache_operator.render.engine import Member, Role, engine_pod
from weightcache_operator.spec import WeightCache


def pick_nodes(
    cache: WeightCache, ready: Mapping[str, Object], load: Counter[str | None]
) -> tuple[list[str], str | None] | None:
    """The nodes a new engine pod may run on — those with a Ready daemon (``ready``: node → its
    daemon pod) — and, with ``gpuAccess: dra``, the one such node running fewest engines
    (``load``, counted up here for the next pick) and the ResourceClaim of its daemon to share.
    None while there is no such node (with dra: no Ready daemon has its claim yet)."""
    nodes = sorted(ready)
    if not uses_dra(cache):
        return (nodes, None) if nodes else None
    claims = {n: c for n in nodes if (c := daemon_claim(ready[n]))}
    if not claims:
        return None
    node = min(sorted(claims), key=lambda n: load[n])  # spread engines over the nodes
    load[node] += 1
    return [node], claims[node]


def new_engine(
    cache: WeightCache,
    replica: int,
    role: Role,
    ready: Mapping[str, Object],
    load: Counter[str | None],
    member: Member | None = None,
) -> Object | None:
    """An engine pod placed by ``pick_nodes``; None while it has nowhere to go."""
    spot = pick_nodes(cache, ready, load)
    if spot is None:
        return None
    nodes, claim = spot
    return engine_pod(cache, replica, role, nodes, claim=claim, member=member)
