"""parallelism.nodes > 1 with DRA: each group member shares the ResourceClaim of the daemon on its
node, and a group whose daemon got a new claim is stale and goes whole."""

from __future__ import annotations

import copy

from builders import make
from group_builders import READY, TWO, ids, plan_groups, run
from weightcache_operator.plan.actions import Create, Delete


def test_dra_groups_share_the_claim_of_the_daemon_on_their_node() -> None:
    body_changes = {**TWO, "daemon.backend": "cuda-vmm", "engine.gpuAccess": "dra", "engine.standbysPerReplica": 0}
    cache = make(**body_changes)
    ready = copy.deepcopy(READY)
    for slot, node_name in ((0, "node-1"), (1, "node-2")):
        ready[slot][node_name]["status"]["resourceClaimStatuses"] = [
            {"name": "gpus", "resourceClaimName": f"c-{node_name}"}
        ]
    [leader] = [a.pod for a in plan_groups(cache, [], ready, ids()) if isinstance(a, Create)]
    assert leader["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-node-1"}]
    running = run(leader, "node-1", "198.18.1.5")
    [follower] = [a.pod for a in plan_groups(cache, [running], ready, ids()) if isinstance(a, Create)]
    assert follower["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": "c-node-2"}]
    # node-2's daemon was replaced (a new claim): the group is stale and goes whole.
    ready[1]["node-2"]["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "c-node-2-new"
    plan = plan_groups(cache, [running, run(follower, "node-2", "198.18.2.5")], ready, ids())
    assert {a.name for a in plan if isinstance(a, Delete)} == {"tiny-0-g0-0", "tiny-0-g0-1"}
