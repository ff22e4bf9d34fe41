"""The securityContext of rendered pods: every container non-root as the images' user, without
capabilities or privilege escalation, under RuntimeDefault seccomp; read-only root filesystems
where the process writes only to its volumes; one root init container that may only chown the
pod's host directories; and an engine template's own securityContext winning field by field."""

from __future__ import annotations

from typing import Any

import pytest
from builders import cache_of, make
from example_caches import body
from rendered import container
from weightcache_operator.render import daemon_daemonset, engine_pod
from weightcache_operator.render.gpu_holder import gpu_holder_daemonset
from weightcache_operator.render.security import RUN_AS

RESTRICTED = {
    "runAsNonRoot": True,
    "runAsUser": RUN_AS,
    "runAsGroup": RUN_AS,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return dict(obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"])


@pytest.mark.parametrize("backend", ["cpu-shm", "cuda-vmm", "cuda-ipc"])
def test_daemon_and_keeper_run_non_root_without_capabilities_on_a_read_only_root(backend: str) -> None:
    ds = daemon_daemonset(make(**{"daemon.backend": backend}))
    names = [c["name"] for c in pod_spec(ds)["containers"]]
    for name in names:
        assert container(ds, name)["securityContext"] == {**RESTRICTED, "readOnlyRootFilesystem": True}, name
    # The launcher's temporary files go to an emptyDir.
    daemon = container(ds, "daemon")
    assert {"name": "TMPDIR", "value": "/weightcache/scratch"} in daemon["env"]
    assert {"name": "weightcache-scratch", "mountPath": "/weightcache/scratch"} in daemon["volumeMounts"]
    assert {"name": "weightcache-scratch", "emptyDir": {}} in pod_spec(ds)["volumes"]
    assert "securityContext" not in pod_spec(ds), "no pod-level field: every container says its own"


def test_only_the_owner_init_container_runs_as_root_and_it_may_only_chown_the_socket_directory() -> None:
    ds = daemon_daemonset(make())
    init, plan = pod_spec(ds)["initContainers"]
    assert plan["name"] == "plan" and plan["securityContext"] == {**RESTRICTED, "readOnlyRootFilesystem": True}
    assert init["command"] == ["chown", "-R", f"{RUN_AS}:{RUN_AS}", "/run/weightcache"]
    assert init["volumeMounts"] == [{"name": "weightcache-sockets", "mountPath": "/run/weightcache"}]
    assert init["securityContext"] == {
        **RESTRICTED,
        "runAsNonRoot": False,
        "runAsUser": 0,
        "runAsGroup": 0,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
        "readOnlyRootFilesystem": True,
    }
    assert init["image"] == "wc/daemon:1" and init["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_the_gpu_holder_owns_its_grant_directory_and_runs_restricted() -> None:
    holder = gpu_holder_daemonset(make(**{"daemon.backend": "cuda-vmm"}), [])
    assert holder is not None
    assert container(holder, "gpu-holder")["securityContext"] == {**RESTRICTED, "readOnlyRootFilesystem": True}
    (init,) = pod_spec(holder)["initContainers"]
    assert init["command"][-1] == "/weightcache/gpus" and init["securityContext"]["capabilities"]["add"] == ["CHOWN"]


def test_a_vllm_profile_daemon_keeps_a_writable_root_for_vllms_caches() -> None:
    ds = daemon_daemonset(cache_of(body()))
    assert container(ds, "daemon")["securityContext"] == RESTRICTED
    assert "TMPDIR" not in [e["name"] for e in container(ds, "daemon")["env"]], "its /tmp is writable"
    assert container(ds, "keeper")["securityContext"]["readOnlyRootFilesystem"] is True


def test_engine_containers_default_to_the_daemons_user_without_capabilities() -> None:
    spec = pod_spec(engine_pod(make(), 0, "active"))
    assert spec["containers"][0]["securityContext"] == RESTRICTED
    assert "securityContext" not in spec, "the pod level is the template's"


def test_an_engine_templates_security_context_wins_field_by_field() -> None:
    template = [
        {
            "name": "engine",
            "image": "e:1",
            "command": ["weightcache", "engine"],
            "securityContext": {"readOnlyRootFilesystem": True, "capabilities": {"add": ["NET_BIND_SERVICE"]}},
        },
        {"name": "sidecar", "image": "s:1", "command": ["sleep"], "securityContext": {"runAsUser": 2000}},
    ]
    spec = pod_spec(engine_pod(make(**{"engine.template.spec.containers": template}), 0, "active"))
    engine, sidecar, _warm = spec["containers"]
    assert engine["securityContext"] == {
        **RESTRICTED,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
    }
    assert sidecar["securityContext"] == {**RESTRICTED, "runAsUser": 2000}


def test_a_pod_level_security_context_in_the_template_is_not_overridden_by_container_defaults() -> None:
    changes = {
        "engine.template.spec.securityContext": {"runAsUser": 0, "runAsNonRoot": False},
        "engine.template.spec.initContainers": [{"name": "prep", "image": "p:1", "command": ["true"]}],
    }
    spec = pod_spec(engine_pod(make(**changes), 0, "active"))
    assert spec["securityContext"] == {"runAsUser": 0, "runAsNonRoot": False}
    expected = {k: v for k, v in RESTRICTED.items() if k not in ("runAsUser", "runAsNonRoot")}
    assert spec["containers"][0]["securityContext"] == expected
    assert spec["initContainers"][0]["securityContext"] == expected, "init containers get the defaults too"
