"""The per-cache daemon DaemonSet: one pod per selected node holding that node's ranks."""

from __future__ import annotations

import copy
from typing import Any

from ..spec import WeightCache
from .layout import (
    SOCKET_MOUNT,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_LABEL,
    STATUS_PORT,
    STATUS_PORT_NAME,
    CacheRef,
    daemon_spec_hash,
    local_ranks,
    model_args,
    model_volume,
    placement_fields,
    rank_range,
    socket_volume,
)

GPU_RESOURCE = "nvidia.com/gpu"
KEEPER_BACKENDS = frozenset({"cpu-shm", "cuda-vmm"})
"""The keeper holds arena fds; a legacy CUDA IPC handle (cuda-ipc) cannot be held by it."""
GPU_BACKENDS = frozenset({"cuda-vmm", "cuda-ipc"})
CLI = ["python", "-m", "weightcache"]
"""The daemon image puts its venv's python first on PATH; ``python -m`` works there and in the
e2e cluster, whose process kubelet runs commands from the test environment."""


def daemon_daemonset(cache: WeightCache) -> dict[str, Any]:
    """Renders the DaemonSet for ``cache`` (nodes = 1: every selected node holds all ranks)."""
    ref = CacheRef.of(cache)
    spec = cache.spec
    ranks = local_ranks(cache)
    spec_hash = daemon_spec_hash(cache)
    labels = ref.labels("daemon")
    model_vol, model_mount = model_volume(cache)
    sock_vol, sock_mount = socket_volume(ref)
    gpu = spec.daemon.backend in GPU_BACKENDS

    daemon_cmd = [
        *CLI, "daemon", *model_args(cache),
        "--backend", spec.daemon.backend,
        "--tp-size", str(spec.parallelism.tensor),
        "--pp-size", str(spec.parallelism.pipeline),
        "--ranks", rank_range(ranks),
        "--socket-dir", SOCKET_MOUNT,
        "--name", ref.name,
        "--keeper", "auto" if spec.daemon.backend in KEEPER_BACKENDS else "off",
        # The pod IP only: the endpoint is for the operator and Prometheus, not for the node's
        # other network namespaces (hostNetwork pods) to find on every interface.
        "--status-addr", f"$(POD_IP):{STATUS_PORT}",
        *spec.daemon.extra_args,
    ]  # fmt: skip
    daemon: dict[str, Any] = {
        "name": "daemon",
        "image": spec.daemon.image,
        "command": daemon_cmd,
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": STATUS_PORT_NAME, "containerPort": STATUS_PORT, "protocol": "TCP"}],
        "volumeMounts": [model_mount, dict(sock_mount)],
        "readinessProbe": {
            "exec": {"command": [*CLI, "probe", "--socket-dir", SOCKET_MOUNT, "--name", ref.name,
                                 "--ranks", rank_range(ranks)]},
            "periodSeconds": 2,
            "timeoutSeconds": 10,
            "failureThreshold": 1,
        },
    }  # fmt: skip
    resources = _daemon_resources(cache) if gpu or spec.daemon.resources else None
    if resources:
        daemon["resources"] = resources

    containers = [daemon]
    if spec.daemon.backend in KEEPER_BACKENDS:
        # A sidecar, so the arena outlives a crashed daemon container in the same pod.
        containers.insert(
            0,
            {
                "name": "keeper",
                "image": spec.daemon.image,
                "command": [*CLI, "keeper", "--socket-dir", SOCKET_MOUNT],
                "volumeMounts": [dict(sock_mount)],
            },
        )

    pod_spec: dict[str, Any] = {
        **placement_fields(cache),
        "terminationGracePeriodSeconds": 30,
        "containers": containers,
        "volumes": [model_vol, sock_vol],
    }
    if spec.daemon.backend == "cuda-ipc":
        # Legacy CUDA IPC handles open only across shared PID and IPC namespaces.
        pod_spec["hostIPC"] = True
        pod_spec["hostPID"] = True

    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": ref.daemon_name,
            "namespace": ref.namespace,
            "labels": labels,
            "annotations": {SPEC_HASH_ANNOTATION: spec_hash},
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": {k: labels[k] for k in ("weightcache.io/cache", "weightcache.io/component")}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": {**labels, SPEC_HASH_LABEL: spec_hash},
                    "annotations": {SPEC_HASH_ANNOTATION: spec_hash},
                },
                "spec": pod_spec,
            },
        },
    }


def _daemon_resources(cache: WeightCache) -> dict[str, Any]:
    """The user's resources plus ``nvidia.com/gpu`` = ranks per node on GPU backends."""
    resources = copy.deepcopy(cache.spec.daemon.resources or {})
    if cache.spec.daemon.backend in GPU_BACKENDS:
        gpus = str(cache.spec.parallelism.ranks_per_node)
        # An explicit, larger count is kept; a smaller one is refused by validation first.
        resources.setdefault("limits", {}).setdefault(GPU_RESOURCE, gpus)
        resources.setdefault("requests", {}).setdefault(GPU_RESOURCE, resources["limits"][GPU_RESOURCE])
    return resources
