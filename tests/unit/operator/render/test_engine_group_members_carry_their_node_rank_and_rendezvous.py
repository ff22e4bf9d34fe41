"""parallelism.nodes > 1: the pods of an engine group share the group's labels and each gets its
node rank and the leader's rendezvous address; a pod with the wrong membership is refused."""

from __future__ import annotations

from builders import make
from group_builders import TWO
from rendered import container, env_of
from weightcache_operator.render import engine_pod, engine_service
from weightcache_operator.render.engine import Member


def test_group_members_get_node_rank_rendezvous_and_shared_labels() -> None:
    cache = make(**TWO)
    leader = engine_pod(cache, 0, "standby", ["node-1"], member=Member("abc123", 0, port=29501))
    follower = engine_pod(cache, 0, "standby", ["node-2"], member=Member("abc123", 1, "198.18.1.7", port=29501))
    assert (leader["metadata"]["name"], follower["metadata"]["name"]) == ("tiny-0-abc123-0", "tiny-0-abc123-1")
    for pod, rank in ((leader, "0"), (follower, "1")):
        labels = pod["metadata"]["labels"]
        assert labels["weightcache.io/engine-group"] == "abc123" and labels["weightcache.io/node-rank"] == rank
        assert labels["weightcache.io/role"] == "standby" and pod["spec"]["readinessGates"]
        env = env_of(container(pod, "engine"))
        assert env["WEIGHTCACHE_ENGINE_NNODES"] == "2" and env["WEIGHTCACHE_ENGINE_NODE_RANK"] == rank
        assert env["WEIGHTCACHE_ENGINE_TP_SIZE"] == "2"
    assert env_of(container(leader, "engine"))["WEIGHTCACHE_ENGINE_DIST_ADDR"] == "$(POD_IP):29501"
    assert env_of(container(follower, "engine"))["WEIGHTCACHE_ENGINE_DIST_ADDR"] == "198.18.1.7:29501"
    assert "readinessProbe" in container(leader, "engine") and "ports" in container(leader, "engine")
    assert "readinessProbe" not in container(follower, "engine"), "a follower serves no HTTP"
    assert engine_service(cache)["spec"]["selector"]["weightcache.io/node-rank"] == "0", "leaders only"


def test_engine_pod_refuses_inconsistent_membership() -> None:
    import pytest

    with pytest.raises(ValueError, match="member"):
        engine_pod(make(**TWO), 0, "active")
    with pytest.raises(ValueError, match="member"):
        engine_pod(make(), 0, "active", member=Member("g", 0))
    with pytest.raises(ValueError, match="leader's pod IP"):
        engine_pod(make(**TWO), 0, "active", member=Member("g", 1))
