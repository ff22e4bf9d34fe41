"""parallelism.nodes > 1: one daemon DaemonSet per node slot, pinned to that slot's nodes and
holding its ranks; parallelism.nodes 1 renders the single DaemonSet as before."""

from __future__ import annotations

from builders import make
from rendered import container
from weightcache_operator.render import engine_service
from weightcache_operator.render.daemon import daemon_daemonset, daemon_daemonsets


def test_one_daemonset_per_slot_pinned_to_its_nodes_holding_its_ranks() -> None:
    cache = make(**{"parallelism.tensor": 4, "parallelism.nodes": 2})
    sets = daemon_daemonsets(cache, [["node-1", "node-3"], ["node-2", "node-4"]])
    assert [ds["metadata"]["name"] for ds in sets] == ["tiny-daemon-0", "tiny-daemon-1"]
    for slot, ds in enumerate(sets):
        cmd = container(ds, "daemon")["command"]
        assert cmd[cmd.index("--ranks") + 1] == ["0-1", "2-3"][slot] and cmd[cmd.index("--tp-size") + 1] == "4"
        assert container(ds, "daemon")["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "status"}
        assert ds["spec"]["selector"]["matchLabels"]["weightcache.io/slot"] == str(slot)
        assert ds["spec"]["template"]["metadata"]["labels"]["weightcache.io/slot"] == str(slot)
        pod = ds["spec"]["template"]["spec"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {
                "matchExpressions": [
                    {
                        "key": "kubernetes.io/hostname",
                        "operator": "In",
                        "values": [["node-1", "node-3"], ["node-2", "node-4"]][slot],
                    }
                ]
            }
        ]
        assert pod["nodeSelector"] == {"pool": "gpu"}, "the placement still applies"
    assert daemon_daemonsets(cache, [["node-1"], []]) == [daemon_daemonset(cache, 0, ["node-1"])], (
        "no nodes, no DaemonSet"
    )


def test_nodes_one_renders_as_before() -> None:
    cache = make()
    assert daemon_daemonsets(cache, []) == [daemon_daemonset(cache)]
    ds = daemon_daemonset(cache)
    assert (
        ds["metadata"]["name"] == "tiny-daemon" and "weightcache.io/slot" not in ds["spec"]["selector"]["matchLabels"]
    )
    assert "affinity" not in ds["spec"]["template"]["spec"]
    assert "weightcache.io/node-rank" not in engine_service(cache)["spec"]["selector"]
