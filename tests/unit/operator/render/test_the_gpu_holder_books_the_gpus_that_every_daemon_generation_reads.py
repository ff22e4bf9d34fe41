"""The GPU holder: one DaemonSet per cache books the node's GPUs for every daemon generation, which read its
grant; on a multi-node cache it runs where slots were assigned; a blue/green change is blocked while a
daemon books GPUs itself or the GPU count changes."""

from __future__ import annotations

import copy

from builders import make
from rendered import container, env_of
from weightcache_operator.render import (
    daemon_daemonset,
)
from weightcache_operator.render.daemon import blue_green_name
from weightcache_operator.render.gpu_holder import blue_green_blocker, gpu_holder_daemonset, reads_grant, stale_holder


def test_gpu_holder_books_the_gpus_and_every_generations_daemons_read_its_grant() -> None:
    cache = make(**{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4})
    holder = gpu_holder_daemonset(cache, [])
    assert holder is not None and holder["metadata"]["name"] == "tiny-gpus"
    assert holder["metadata"]["labels"]["weightcache.io/cache"] == "tiny", "finalize deletes it by this label"
    assert holder["metadata"]["labels"]["weightcache.io/component"] == "gpu-holder"
    assert holder["spec"]["selector"]["matchLabels"] == {
        "weightcache.io/cache": "tiny",
        "weightcache.io/component": "gpu-holder",
    }
    assert holder["spec"]["updateStrategy"] == {"type": "OnDelete"}, "a holder pod is never replaced behind our back"
    assert holder["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pod = holder["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    main = container(holder, "gpu-holder")
    assert main["command"] == [
        "python",
        "-m",
        "weightcache",
        "gpu-holder",
        "--out",
        "/weightcache/gpus/gpus.json",
        "--expect",
        "4",
    ]
    assert main["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert main["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert {e["name"] for e in main["env"]} == {"POD_NAME", "POD_UID", "NODE_NAME", "WEIGHTCACHE_TERMINATION_LOG"}
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in main["env"]}, "the device plugin sets it"
    assert holder["spec"]["template"]["metadata"]["annotations"] == {"weightcache.io/gpus-per-node": "4"}
    # The per-cache host directory: the parent of every generation's socket directory.
    assert pod["volumes"] == [
        {"name": "weightcache-gpus", "hostPath": {"path": "/run/weightcache/ns-tiny", "type": "DirectoryOrCreate"}}
    ]
    assert main["volumeMounts"] == [{"name": "weightcache-gpus", "mountPath": "/weightcache/gpus"}]

    old, new = cache, make(**{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4, "model.dtype": "bfloat16"})
    assert gpu_holder_daemonset(new, []) == holder, "one holder for every generation"
    for gen in (old, new):
        ds = daemon_daemonset(gen, name=blue_green_name(gen))
        daemon = container(ds, "daemon")
        assert "resources" not in daemon and env_of(daemon)["NVIDIA_VISIBLE_DEVICES"] == "all"
        cmd = daemon["command"]
        assert cmd[cmd.index("--gpus-file") + 1] == "/weightcache/gpus/gpus.json"
        assert daemon["readinessProbe"]["httpGet"]["path"] == "/ready", "the endpoint checks the grant (--gpus-file)"
        assert {"name": "weightcache-gpus", "mountPath": "/weightcache/gpus", "readOnly": True} in daemon[
            "volumeMounts"
        ]
        volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
        assert volumes["weightcache-gpus"]["hostPath"]["path"] == "/run/weightcache/ns-tiny"
        assert volumes["weightcache-sockets"]["hostPath"]["path"].startswith("/run/weightcache/ns-tiny/")
        assert reads_grant(ds)
        assert "volumeMounts" not in container(ds, "keeper") or all(
            m["name"] != "weightcache-gpus" for m in container(ds, "keeper")["volumeMounts"]
        )
    assert gpu_holder_daemonset(make(), []) is None and not reads_grant(daemon_daemonset(make())), "cpu-shm"


def test_gpu_holder_of_a_multi_node_cache_runs_where_slots_were_assigned() -> None:
    cache = make(**{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4, "parallelism.nodes": 2})
    holder = gpu_holder_daemonset(cache, [["node-2", "node-1"], ["node-3"]])
    assert holder is not None
    assert container(holder, "gpu-holder")["resources"]["limits"] == {"nvidia.com/gpu": "2"}, "ranks per node"
    terms = holder["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-2", "node-3"]}
    ]
    assert gpu_holder_daemonset(cache, [[], []]) is None, "no node may run a daemon"


def test_blue_green_on_gpus_is_blocked_by_daemons_that_book_gpus_themselves_or_a_gpu_count_change() -> None:
    cache = make(**{"daemon.backend": "cuda-vmm", "parallelism.tensor": 4})
    rendered = gpu_holder_daemonset(cache, [])
    assert rendered is not None
    holder_pod = {
        "metadata": {"name": "tiny-gpus-x", **rendered["spec"]["template"]["metadata"]},
        "spec": rendered["spec"]["template"]["spec"],
    }
    daemon_pod = {"metadata": {"name": "tiny-daemon-x"}, "spec": daemon_daemonset(cache)["spec"]["template"]["spec"]}
    assert blue_green_blocker(cache, [daemon_pod], [holder_pod]) is None
    assert not stale_holder(cache, holder_pod)
    legacy = copy.deepcopy(daemon_pod)
    legacy["metadata"]["name"] = "tiny-daemon-old"
    container({"kind": "Pod", "spec": legacy["spec"]}, "daemon")["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    why = blue_green_blocker(cache, [daemon_pod, legacy], [holder_pod])
    assert why is not None and "tiny-daemon-old requests nvidia.com/gpu itself" in why
    wider = make(**{"daemon.backend": "cuda-vmm", "parallelism.tensor": 8})
    assert stale_holder(wider, holder_pod)
    why = blue_green_blocker(wider, [daemon_pod], [holder_pod])
    assert why is not None and "GPUs per node change (4 → 8)" in why
    assert not stale_holder(make(), holder_pod), "cpu-shm has no holder to be stale"
