"""Renderers (spec → manifests), status aggregation and cross-field validation messages."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

import pytest
from builders import BASE, NOW, changed, container_status, daemon, engine, make
from weightcache_operator.observe.validation import parse
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import (
    READY_GATE,
    SPEC_HASH_ANNOTATION,
    daemon_daemonset,
    daemon_spec_hash,
    engine_pod,
    engine_service,
    engine_template_hash,
    local_ranks,
)
from weightcache_operator.render.daemon import blue_green_name
from weightcache_operator.render.dra import claim_template, daemon_claim, engine_claim_current
from weightcache_operator.render.gpu_holder import blue_green_blocker, gpu_holder_daemonset, reads_grant, stale_holder


def container(obj: dict[str, Any], name: str) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in c["env"]}


# --- daemon -------------------------------------------------------------------------------------


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
        {"name": "TMPDIR", "value": "/weightcache/scratch"},
        {"name": "WEIGHTCACHE_TERMINATION_LOG", "value": "/dev/termination-log"},
    ]
    assert daemon["ports"] == [{"name": "status", "containerPort": 9400, "protocol": "TCP"}]
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


def test_every_rendered_container_leaves_its_fatal_error_as_its_termination_message() -> None:
    gpu = make(**{"daemon.backend": "cuda-vmm"})
    holder = gpu_holder_daemonset(gpu, [])
    assert holder is not None
    rendered = [
        container(daemon_daemonset(gpu), "daemon"),
        container(daemon_daemonset(gpu), "keeper"),
        container(holder, "gpu-holder"),
        engine_pod(gpu, 0, "active")["spec"]["containers"][0],
    ]
    for c in rendered:
        assert (c["terminationMessagePath"], c["terminationMessagePolicy"]) == (
            "/dev/termination-log",
            "FallbackToLogsOnError",
        )
        assert env_of(c)["WEIGHTCACHE_TERMINATION_LOG"] == "/dev/termination-log", c["name"]
    # A path the user's engine template chooses is kept, and the CLI is told that one.
    own = make(**{"engine.template.spec.containers": [{"name": "e", "terminationMessagePath": "/tmp/why"}]})
    engine = engine_pod(own, 0, "active")["spec"]["containers"][0]
    assert engine["terminationMessagePath"] == env_of(engine)["WEIGHTCACHE_TERMINATION_LOG"] == "/tmp/why"


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


def test_spec_hash_follows_daemon_inputs_only() -> None:
    base = daemon_spec_hash(make())
    assert daemon_spec_hash(make()) == base
    assert daemon_spec_hash(make(**{"model.dtype": "bfloat16"})) != base
    assert daemon_spec_hash(make(**{"daemon.image": "wc/daemon:2"})) != base
    assert daemon_spec_hash(make(**{"engine.replicas": 3})) == base, "engine scaling must not restart daemons"
    assert daemon_spec_hash(make(**{"daemon.generationChange": "NodeByNode"})) == base, (
        "how to roll is not what is held"
    )


def test_blue_green_daemonset_is_a_second_daemonset_with_its_own_socket_directory() -> None:
    old, new = make(), make(**{"model.revision": "r2"})
    serving = daemon_daemonset(old)
    green = daemon_daemonset(
        new, name=blue_green_name(new), annotations={"weightcache.io/generation-change": "BlueGreen"}
    )
    assert green["metadata"]["name"] != serving["metadata"]["name"]
    assert green["metadata"]["name"].startswith("tiny-daemon-")
    assert green["metadata"]["annotations"] == {
        "weightcache.io/generation-change": "BlueGreen",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(new),
    }
    sockets = [
        {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}["weightcache-sockets"]["hostPath"]["path"]
        for ds in (serving, green)
    ]
    assert sockets[0] != sockets[1] and sockets[1].endswith(daemon_spec_hash(new))
    engine = engine_pod(new, 0, "active", ["node-1"])
    assert {v["name"]: v for v in engine["spec"]["volumes"]}["weightcache-sockets"]["hostPath"]["path"] == sockets[1]


def test_rank_to_node_mapping() -> None:
    assert local_ranks(make(**{"parallelism.tensor": 4})) == [0, 1, 2, 3]
    cache = make(**{"parallelism.tensor": 4, "parallelism.pipeline": 2})
    assert local_ranks(cache) == list(range(8))


# --- engines and service -----------------------------------------------------------------------


def test_engine_pod_gets_socket_env_gate_and_labels() -> None:
    pod = engine_pod(make(), replica=0, role="standby")
    meta = pod["metadata"]
    assert meta["generateName"] == "tiny-0-"
    assert meta["labels"] == {
        "app": "chat",
        "weightcache.io/cache": "tiny",
        "weightcache.io/component": "engine",
        "app.kubernetes.io/managed-by": "weightcache-operator",
        "weightcache.io/replica": "0",
        "weightcache.io/role": "standby",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(make()),
        "weightcache.io/engine-hash": engine_template_hash(make()),
    }
    assert meta["ownerReferences"][0]["kind"] == "WeightCache"
    assert pod["spec"]["readinessGates"] == [{"conditionType": READY_GATE}]
    engine = container(pod, "engine")
    env = env_of(engine)
    assert env["WEIGHTCACHE_ENGINE_SOCKET_DIR"] == "/run/weightcache" and env["WEIGHTCACHE_ENGINE_NAME"] == "tiny"
    assert env["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE"] == "client"
    assert env["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_FALLBACK"] == "disk"
    assert env["WEIGHTCACHE_ENGINE_TP_SIZE"] == "2" and env["WEIGHTCACHE_ENGINE_REVISION"] == "r1"
    assert env["WEIGHTCACHE_ENGINE_HOST"] == "$(POD_IP)" and env["WEIGHTCACHE_ENGINE_THREADS"] == "1"
    names = [e["name"] for e in engine["env"]]
    assert names.index("POD_IP") < names.index("WEIGHTCACHE_ENGINE_HOST"), "$(POD_IP) expands only if defined first"
    assert engine["readinessProbe"]["httpGet"] == {"path": "/ready", "port": 8000}
    mounts = {m["name"]: m for m in engine["volumeMounts"]}
    assert mounts["weightcache-sockets"]["mountPath"] == "/run/weightcache" and mounts["model"]["readOnly"]
    assert pod["spec"]["nodeSelector"] == {"pool": "gpu"}


def test_template_env_wins_and_gpu_access() -> None:
    tpl = copy.deepcopy(BASE["spec"]["engine"]["template"])
    tpl["spec"]["containers"][0]["env"] = [{"name": "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE", "value": "off"}]
    cache = make(**{"engine.template": tpl, "daemon.backend": "cuda-vmm", "engine.weightFallback": "error"})
    engine = container(engine_pod(cache, 2, "active"), "engine")
    env = [e for e in engine["env"] if e["name"] == "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE"]
    assert env == [{"name": "WEIGHTCACHE_ENGINE_WEIGHT_CACHE_MODE", "value": "off"}]
    assert env_of(engine)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(engine)["WEIGHTCACHE_ENGINE_WEIGHT_CACHE_FALLBACK"] == "error"
    assert "resources" not in engine, "visibleDevices: engines request no GPUs"
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(container(engine_pod(make(), 0, "active"), "engine"))


def test_service_selects_active_engines() -> None:
    svc = engine_service(make(**{"service": {"name": "chat", "port": 80, "type": "ClusterIP"}, "engine.port": 8001}))
    assert svc["metadata"]["name"] == "chat"
    assert svc["metadata"]["annotations"] == {"weightcache.io/served-model-name": "tiny"}
    assert svc["spec"]["selector"] == {
        "weightcache.io/cache": "tiny",
        "weightcache.io/component": "engine",
        "weightcache.io/role": "active",
        "weightcache.io/daemon-spec-hash": daemon_spec_hash(make()),
    }
    assert svc["spec"]["ports"][0]["port"] == 80 and svc["spec"]["ports"][0]["targetPort"] == 8001
    # During a generation change the operator keeps the old generation selected until it switches.
    assert engine_service(make(), "0ld")["spec"]["selector"]["weightcache.io/daemon-spec-hash"] == "0ld"


def test_engine_hash_follows_the_rendered_pod_not_its_role_or_node() -> None:
    """A rollout's version: the template, port, env and the daemon generation change it; the
    role, replica and nodes an engine is pinned to do not (they differ between pods of a version)."""
    base = make()
    assert engine_template_hash(base) == engine_template_hash(make())
    same = {
        engine_pod(base, r, role, nodes)["metadata"]["labels"]["weightcache.io/engine-hash"]
        for r, role, nodes in ((0, "active", None), (3, "standby", ["node-1"]))
    }
    assert same == {engine_template_hash(base)}
    tpl = copy.deepcopy(BASE["spec"]["engine"]["template"])
    tpl["spec"]["containers"][0]["env"] = [{"name": "VERSION", "value": "2"}]
    changed = [make(**{"engine.template": tpl}), make(**{"engine.port": 8123}), make(**{"model.revision": "r2"})]
    assert len({engine_template_hash(c) for c in changed} | {engine_template_hash(base)}) == 4
    assert daemon_spec_hash(changed[0]) == daemon_spec_hash(base), "a template change leaves the daemons alone"
    assert daemon_spec_hash(changed[2]) != daemon_spec_hash(base)
    # The rollout settings decide how a version rolls, not what it is.
    assert engine_template_hash(make(**{"engine.rollout": {"readyDeadlineSeconds": 5}})) == engine_template_hash(base)
    # Nor do the failover settings: changing the daemon outage grace must not roll every engine.
    assert engine_template_hash(make(**{"engine.failover": {"daemonOutageGraceSeconds": 2}})) == engine_template_hash(
        base
    )


def test_engines_serve_under_the_caches_name_unless_the_spec_names_another() -> None:
    """Clients ask for the name ``kubectl get wc`` shows; a different served name is a new engine
    version (a rollout), never a new daemon generation."""
    base = make()
    assert env_of(container(engine_pod(base, 0, "active"), "engine"))["WEIGHTCACHE_ENGINE_SERVED_MODEL_NAME"] == "tiny"
    named = make(**{"engine.servedModelName": "Qwen/Qwen3-0.6B"})
    env = env_of(container(engine_pod(named, 0, "active"), "engine"))
    assert env["WEIGHTCACHE_ENGINE_SERVED_MODEL_NAME"] == "Qwen/Qwen3-0.6B"
    assert engine_template_hash(named) != engine_template_hash(base)
    assert daemon_spec_hash(named) == daemon_spec_hash(base)
    # The default follows the cache's name: another cache of the same spec serves another name.
    other = copy.deepcopy(BASE)
    other["metadata"]["name"] = "chat"
    renamed, problems = parse(other)
    assert renamed is not None and not problems
    assert engine_template_hash(renamed) != engine_template_hash(base)
    status = aggregate(named, Observed([], [], 1), NOW).wire()
    assert status["servedModelName"] == "Qwen/Qwen3-0.6B"
    assert aggregate(base, Observed([], [], 1), NOW).wire()["servedModelName"] == "tiny"


@pytest.mark.parametrize("name", ["", "two words", "x" * 257])
def test_a_served_model_name_clients_could_not_send_is_refused(name: str) -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["engine"]["servedModelName"] = name
    cache, problems = parse(body)
    assert cache is None and any("servedModelName" in p for p in problems), problems


def test_daemonset_is_replaced_by_the_operator_only() -> None:
    assert daemon_daemonset(make())["spec"]["updateStrategy"] == {"type": "OnDelete"}


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


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc", "cpu-shm"])
@pytest.mark.parametrize("access", ["visibleDevices", "dra"])
def test_gpu_access_modes_for_each_backend(backend: str, access: str) -> None:
    """visibleDevices: the daemon requests nvidia.com/gpu and engines see every device; dra: the
    daemon claims devices from a template and engines share that very claim; cpu-shm: no GPUs."""
    body = copy.deepcopy(BASE)
    body["spec"]["daemon"]["backend"] = backend
    body["spec"]["engine"]["gpuAccess"] = access
    cache, problems = parse(body)
    if backend == "cpu-shm" and access == "dra":
        assert cache is None and any("needs a GPU daemon backend" in p for p in problems), problems
        return
    assert cache is not None and not problems, problems
    ds = daemon_daemonset(cache)
    pod_spec = ds["spec"]["template"]["spec"]
    daemon = container(ds, "daemon")
    claim = "tiny-daemon-abcde-gpus-x7"
    engine = engine_pod(cache, 0, "active", ["node-1"], claim=claim if access == "dra" else None)
    main = container(engine, "engine")
    if access == "dra":
        template = claim_template(cache)
        assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
        assert (
            template["metadata"]["name"] == "tiny-gpus" and template["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        )
        assert template["spec"]["spec"]["devices"]["requests"] == [
            {
                "name": "gpus",
                "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
            }
        ]
        assert pod_spec["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "tiny-gpus"}]
        assert daemon["resources"] == {"claims": [{"name": "gpus"}]}, "no nvidia.com/gpu next to a claim"
        assert "resources" not in container(ds, "keeper") if backend == "cuda-vmm" else True
        assert engine["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimName": claim}]
        assert main["resources"] == {"claims": [{"name": "gpus"}]}
        assert engine["metadata"]["annotations"]["weightcache.io/resource-claim"] == claim
        assert "NVIDIA_VISIBLE_DEVICES" not in env_of(main), "the claim's devices are the engine's devices"
        with pytest.raises(ValueError, match="ResourceClaim"):
            engine_pod(cache, 0, "active")
    else:
        assert "resourceClaims" not in pod_spec and "resourceClaims" not in engine["spec"]
        assert "resources" not in main and "weightcache.io/resource-claim" not in engine["metadata"]["annotations"]
        assert "resources" not in daemon, "the GPU holder requests the GPUs"
        holder = gpu_holder_daemonset(cache, [])
        gpus = None if holder is None else container(holder, "gpu-holder")["resources"]["limits"]["nvidia.com/gpu"]
        assert gpus == (None if backend == "cpu-shm" else "2")
        assert ("NVIDIA_VISIBLE_DEVICES" in env_of(main)) is (backend != "cpu-shm")
        assert env_of(daemon).get("NVIDIA_VISIBLE_DEVICES") == (None if backend == "cpu-shm" else "all")
    if access == "dra":
        assert gpu_holder_daemonset(cache, []) is None and not reads_grant(ds), "the claim books the GPUs"
        assert "--gpus-file" not in daemon["command"]


def test_dra_device_class_and_claim_currency() -> None:
    cache = make(
        **{
            "daemon.backend": "cuda-vmm",
            "engine.gpuAccess": "dra",
            "engine.dra": {"deviceClassName": "h200.gpu.example.com"},
            "parallelism.tensor": 4,
        }
    )
    request = claim_template(cache)["spec"]["spec"]["devices"]["requests"][0]
    assert request["exactly"]["deviceClassName"] == "h200.gpu.example.com" and request["exactly"]["count"] == 4
    claimed = daemon(claim="c-1")
    assert daemon_claim(claimed) == "c-1" and daemon_claim(daemon()) is None
    engine = engine_pod(cache, 0, "active", ["n"], claim="c-1")
    assert engine_claim_current(engine, claimed)
    assert not engine_claim_current(engine_pod(cache, 0, "active", ["n"], claim="c-0"), claimed), "replaced daemon"
    assert not engine_claim_current(engine, None)
    assert engine_claim_current(engine_pod(make(), 0, "active"), None), "visibleDevices depends on no claim"
    body = copy.deepcopy(BASE)
    body["spec"]["engine"]["dra"] = {"deviceClassName": "Not_A_Name"}
    assert parse(body)[0] is None


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        (
            {
                "daemon.backend": "cuda-vmm",
                "parallelism.tensor": 4,
                "daemon.resources": {"limits": {"nvidia.com/gpu": 2}},
            },
            "GPUs per node must be ≥ ranks per node",
        ),
        (
            {
                "daemon.backend": "cuda-vmm",
                "engine.gpuAccess": "dra",
                "daemon.resources": {"requests": {"nvidia.com/gpu": 2}},
            },
            "remove nvidia.com/gpu",
        ),
        ({"daemon.resources": {"limits": {"nvidia.com/gpu": 1}}}, "cpu-shm uses no GPUs"),
        ({"model.quantization": {"method": "fp8", "weightBlockSize": [64, 64]}}, "verified for [128, 128] only"),
        ({"engine.template": {"spec": {"containers": [{"image": "x"}]}}}, "containers[0] needs a name"),
        ({"engine.template": {"spec": {"hostNetwork": True, "containers": [{"name": "e"}]}}}, "hostNetwork"),
        ({"daemon.backend": "rdma"}, "daemon.backend"),
        ({"parallelism.tensor": 3, "parallelism.nodes": 2}, "multiple of nodes"),
    ],
)
def test_invalid_specs_are_named(changes: dict[str, Any], needle: str) -> None:
    cache, problems = parse(changed(BASE, **changes))
    assert problems and any(needle in p for p in problems), problems


# --- status ------------------------------------------------------------------------------------


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_status_ready_loading_and_transition_times() -> None:
    cache = make()
    good = {SPEC_HASH_ANNOTATION: daemon_spec_hash(cache)}
    daemon_pod = daemon("tiny-daemon-x", ready=True, annotations=good)
    seen = Observed(
        [daemon_pod],
        [engine("tiny-0-a", role="active", ready=True), engine("tiny-0-b", role="standby", ready=True)],
        1,
    )
    status = aggregate(cache, seen, NOW).wire()
    assert status["phase"] == "Ready" and status["readyNodes"] == "1/1"
    assert (status["activeEngines"], status["standbyEngines"]) == (1, 1)
    assert status["engines"] == [{"replica": 0, "active": "tiny-0-a", "standbys": ["tiny-0-b"]}]
    assert status["nodes"][0]["ranks"] == [{"rank": 0, "ready": True}, {"rank": 1, "ready": True}]
    assert status["model"] == "hostPath:/models/tiny@r1" and status["observedGeneration"] == 3
    assert conditions(status) == {
        "DaemonsReady": ("True", "AllNodesReady"),
        "EnginesReady": ("True", "AllEnginesReady"),
        "Available": ("True", "ActiveEnginesReady"),
        "Progressing": ("False", "Converged"),
        "Degraded": ("False", "Healthy"),
        "CheckpointChanged": ("False", "Unchanged"),
    }

    # A daemon of an older spec does not count, and the DaemonsReady transition is stamped now.
    later = datetime(2026, 11, 29, 10, 5, tzinfo=UTC)
    stale = daemon("tiny-daemon-x", ready=True, spec_hash="old")
    status2 = aggregate(cache, Observed([stale], seen.engine_pods, 1), later, status["conditions"]).wire()
    by_type = {c["type"]: c for c in status2["conditions"]}
    assert status2["phase"] == "Loading" and status2["readyNodes"] == "0/1"
    assert by_type["DaemonsReady"]["lastTransitionTime"] == "2026-11-29T10:05:00Z"
    assert by_type["Available"]["lastTransitionTime"] == "2026-11-29T10:00:00Z", "unchanged status keeps its time"


def test_status_pending_degraded_and_invalid() -> None:
    cache = make()
    assert aggregate(cache, Observed([], [], 0), NOW).wire()["phase"] == "Pending"
    looping = daemon("tiny-daemon-x", ready=False, containers=[container_status("main", waiting="CrashLoopBackOff")])
    status = aggregate(cache, Observed([looping], [], 1), NOW).wire()
    assert status["phase"] == "Degraded" and conditions(status)["Degraded"] == ("True", "CrashLoop")
    invalid = aggregate(cache, Observed(problems=["spec.model.quantization.weightBlockSize [64, 64] ..."]), NOW).wire()
    assert invalid["phase"] == "Failed"
    degraded = next(c for c in invalid["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InvalidSpec" and "[64, 64]" in degraded["message"]


def test_terminating_or_unready_engines_are_not_counted() -> None:
    cache = make(**{"engine.replicas": 2})
    going = engine("tiny-0-a", role="active", ready=True)
    going["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    seen = Observed(
        [],
        [
            going,
            engine("tiny-1-a", replica=1, role="active", ready=False),
            engine("tiny-1-b", replica=1, role="standby", ready=True),
        ],
        1,
    )
    status = aggregate(cache, seen, NOW).wire()
    assert (status["activeEngines"], status["standbyEngines"]) == (0, 1)
    assert status["engines"][0] == {"replica": 0, "active": None, "standbys": []}
    assert conditions(status)["Available"] == ("False", "NoActiveEngine")


def test_new_engines_are_pinned_to_nodes_with_ready_daemons_keeping_user_affinity() -> None:
    term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    pod = engine_pod(make(**{"placement.affinity": affinity}), 0, "active", nodes=["node-2", "node-1"])
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-2"]},
            ]
        }
    ]
    assert "nodeAffinity" not in (engine_pod(make(), 0, "active").get("spec", {}).get("affinity") or {})
    assert affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [term], (
        "the spec's affinity object must not be mutated"
    )


def test_shipped_cluster_role_names_every_verb_and_resource() -> None:
    from pathlib import Path

    import yaml

    deploy = Path(__file__).resolve().parents[2] / "deploy" / "operator.yaml"
    role = next(d for d in yaml.safe_load_all(deploy.read_text()) if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert not secrets, "the operator reads no Secrets"


def test_operator_priority_from_environment() -> None:
    from weightcache_operator.run.handlers import _priority

    assert _priority("42") == 42
    uid = "0b6f0e7e-8a3c-4f59-9d7d-5c3f3c1d2e10"
    assert _priority(uid) == _priority(uid) and _priority(uid) != _priority(uid[::-1])
    assert 1 <= _priority("") <= 1_000_000


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
