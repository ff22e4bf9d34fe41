"""The daemon DaemonSet: every local rank in one launcher with its keeper, status endpoint and readiness
probe, the backend's host namespaces, the user's resources, arguments and model source passed through,
and replaced by the operator only."""

from __future__ import annotations

import pytest
from builders import make
from rendered import container, env_of
from weightcache_operator.render import (
    SPEC_HASH_ANNOTATION,
    daemon_daemonset,
    daemon_spec_hash,
    engine_pod,
    local_ranks,
)
from weightcache_operator.render.gpu_holder import gpu_holder_daemonset


def test_expert_parallelism_reaches_daemon_and_engine_and_is_absent_at_one() -> None:
    moe = make(**{"parallelism.expert": 2})
    cmd = container(daemon_daemonset(moe), "daemon")["command"]
    assert cmd[cmd.index("--ep-size") + 1] == "2" and cmd[cmd.index("--tp-size") + 1] == "2"
    env = env_of(container(engine_pod(moe, 0, "active"), "engine"))
    assert env["WEIGHTCACHE_ENGINE_EP_SIZE"] == "2"
    assert daemon_spec_hash(moe) != daemon_spec_hash(make())  # other experts per rank: other daemons
    # expert 1 (the default) renders nothing: caches without experts keep their objects and spec hash
    # (the value below is what the operator computed for this spec before `expert` existed).
    plain = make(**{"parallelism.expert": 1})
    assert "--ep-size" not in container(daemon_daemonset(plain), "daemon")["command"]
    assert "WEIGHTCACHE_ENGINE_EP_SIZE" not in env_of(container(engine_pod(plain, 0, "active"), "engine"))
    assert daemon_spec_hash(plain) == daemon_spec_hash(make()) == "6cd1557d02dedfd0"


def test_cpu_daemonset_runs_all_local_ranks_with_keeper_and_probe() -> None:
    ds = daemon_daemonset(make())
    pod = ds["spec"]["template"]["spec"]
    daemon = container(ds, "daemon")
    cmd = daemon["command"]
    assert cmd[:4] == ["python", "-m", "weightcache", "daemon"]
    assert cmd[cmd.index("--ranks") + 1] == "0-1" and cmd[cmd.index("--tp-size") + 1] == "2"
    assert cmd[cmd.index("--name") + 1] == "tiny" and cmd[cmd.index("--revision") + 1] == "r1"
    assert cmd[cmd.index("--keeper") + 1] == "auto"
    # The status endpoint on the pod IP, found by the operator through the named port.
    assert cmd[cmd.index("--status-addr") + 1] == "$(POD_IP):9400"
    assert daemon["env"] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "TMPDIR", "value": "/weightcache/scratch"},
        {"name": "WEIGHTCACHE_TERMINATION_LOG", "value": "/dev/termination-log"},
    ]
    # Seeding (on by default) serves on its own named port: local rank 0's (rank i: 9410 + i).
    assert daemon["ports"] == [
        {"name": "status", "containerPort": 9400, "protocol": "TCP"},
        {"name": "seed", "containerPort": 9410, "protocol": "TCP"},
    ]
    # Readiness from the launcher's status endpoint (the named port): no process start per probe.
    assert daemon["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "status"}
    assert "exec" not in daemon["readinessProbe"] and daemon["readinessProbe"]["failureThreshold"] == 3
    assert container(ds, "keeper")["command"][3] == "keeper"
    assert "resources" not in daemon, "cpu-shm requests no GPUs"
    assert "hostIPC" not in pod and "hostPID" not in pod
    assert pod["nodeSelector"] == {"pool": "gpu"} and pod["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["model"]["hostPath"]["path"] == "/models/tiny"
    # One directory per generation, so two generations' daemons can share a node (blue/green).
    assert volumes["weightcache-sockets"]["hostPath"] == {
        "path": f"/run/weightcache/ns-tiny/{daemon_spec_hash(make())}",
        "type": "DirectoryOrCreate",
    }
    assert {"name": "model", "mountPath": "/weightcache/model", "readOnly": True} in daemon["volumeMounts"]
    spec_hash = daemon_spec_hash(make())
    assert ds["spec"]["template"]["metadata"]["annotations"][SPEC_HASH_ANNOTATION] == spec_hash
    assert ds["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


@pytest.mark.parametrize(
    ("backend", "keeper", "host_ns"), [("cuda-vmm", True, False), ("cuda-ipc", False, True), ("cpu-shm", True, False)]
)
def test_backends(backend: str, keeper: bool, host_ns: bool) -> None:
    ds = daemon_daemonset(make(**{"daemon.backend": backend, "parallelism.tensor": 4}))
    pod = ds["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert ("keeper" in names) is keeper
    assert bool(pod.get("hostIPC")) is host_ns and bool(pod.get("hostPID")) is host_ns
    daemon = container(ds, "daemon")
    assert daemon.get("resources", {}) == {}, "GPUs are booked by the GPU holder, not by daemon pods"
    assert ("--gpus-file" in daemon["command"]) is (backend != "cpu-shm")


def test_user_resources_and_extra_args_pass_through() -> None:
    cache = make(
        **{
            "daemon.backend": "cuda-vmm",
            "daemon.resources": {"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}},
            "daemon.extraArgs": ["--load-workers", "8"],
        }
    )
    daemon = container(daemon_daemonset(cache), "daemon")
    assert daemon["resources"] == {"limits": {"memory": "64Gi"}}, "the explicit GPU count goes to the GPU holder"
    assert daemon["command"][-2:] == ["--load-workers", "8"]
    holder = gpu_holder_daemonset(cache, [])
    assert holder is not None
    assert container(holder, "gpu-holder")["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    only_gpus = make(**{"daemon.backend": "cuda-vmm", "daemon.resources": {"limits": {"nvidia.com/gpu": 8}}})
    assert "resources" not in container(daemon_daemonset(only_gpus), "daemon")


def test_pvc_source_mounts_sub_path_read_only() -> None:
    cache = make(**{"model.source": {"pvc": {"claimName": "models", "subPath": "qwen3"}}})
    ds = daemon_daemonset(cache)
    vol = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "model")
    assert vol["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    mount = next(m for m in container(ds, "daemon")["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/weightcache/model", "readOnly": True, "subPath": "qwen3"}


def test_rank_to_node_mapping() -> None:
    assert local_ranks(make(**{"parallelism.tensor": 4})) == [0, 1, 2, 3]
    cache = make(**{"parallelism.tensor": 4, "parallelism.pipeline": 2})
    assert local_ranks(cache) == list(range(8))


def test_daemonset_is_replaced_by_the_operator_only() -> None:
    assert daemon_daemonset(make())["spec"]["updateStrategy"] == {"type": "OnDelete"}
