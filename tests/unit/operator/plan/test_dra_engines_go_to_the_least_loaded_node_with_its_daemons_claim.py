"""Where a new DRA engine goes (placement.new_engine): the least loaded node whose daemon has its claim, or
nowhere yet."""

from __future__ import annotations

from builders import daemon, make


def test_dra_engines_go_to_the_least_loaded_node_with_its_daemons_claim() -> None:
    from collections import Counter

    from weightcache_operator.plan.placement import new_engine as choose

    cache = make(**{"daemon.backend": "cuda-vmm", "engine.gpuAccess": "dra"})

    ready = {n: daemon(node=n, claim=c) for n, c in (("node-1", "c-1"), ("node-2", "c-2"), ("node-3", None))}
    load: Counter[str | None] = Counter({"node-1": 2})
    first = choose(cache, 0, "active", ready, load)
    second = choose(cache, 0, "standby", ready, load)
    assert first is not None and second is not None
    assert first["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-2"}]
    assert second["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-2"}], "node-1 runs 2, node-2 1"
    assert choose(cache, 0, "active", {"node-3": ready["node-3"]}, Counter()) is None, "no claim yet: wait"
