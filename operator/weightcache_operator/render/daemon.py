"""The daemon DaemonSets: one pod per selected node holding that node's ranks.

``nodes = 1``: one DaemonSet ``<name>-daemon`` over the placement; every node holds all ranks.
``nodes > 1``: one DaemonSet ``<name>-daemon-<slot>`` per node slot, pinned (node affinity) to
the nodes ``topology.assign_slots`` gave that slot, each holding only its slot's ranks — a single
pod template cannot differ per node, so the slot's ranks must live in the template itself.

On GPU backends (without ``gpuAccess: dra``) daemon pods request no GPUs: the GPU holder
(gpu_holder.py) books them, and the daemons read which ones from its grant (``--gpus-file``).
"""

from __future__ import annotations

import copy
from typing import Any

from weightcache_contract.backends import FD_BACKENDS, GPU_BACKENDS
from weightcache_contract.launch import DaemonArgs, KeeperArgs

from weightcache_operator import profiles
from weightcache_operator.render.artifacts import daemon_artifact_volume
from weightcache_operator.render.dra import container_claims, daemon_claim_fields, uses_dra
from weightcache_operator.render.gpu_holder import GPU_RESOURCE, GPUS_FILE, gpus_volume, uses_gpu_holder
from weightcache_operator.render.layout import (
    daemon_spec_hash,
    explain_exits,
    model_volume,
    pin_to_nodes,
    placement_fields,
    socket_volume,
)
from weightcache_operator.render.plan import plan_init
from weightcache_operator.render.security import container_security, owner_init, scratch_volume
from weightcache_operator.render.seeding import NODE_NAME_ENV, seed_daemon_args, seed_port, seed_volumes, uses_seeding
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import (
    CLI,
    MODEL_MOUNT,
    SLOT_LABEL,
    SOCKET_MOUNT,
    SPEC_HASH_ANNOTATION,
    SPEC_HASH_LABEL,
    STATUS_PORT,
    STATUS_PORT_NAME,
    CacheRef,
    local_ranks,
)


def daemon_daemonsets(
    cache: WeightCache, slots: list[list[str]], name: str | None = None, annotations: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every daemon DaemonSet ``cache`` needs; ``slots[k]`` are the nodes assigned slot ``k``
    (ignored with ``nodes = 1``). A slot without nodes gets no DaemonSet: nothing may run it.
    ``name`` and ``annotations``: see ``daemon_daemonset`` (with ``nodes > 1``, ``name`` is the
    base the slot number is appended to)."""
    if cache.spec.parallelism.nodes == 1:
        return [daemon_daemonset(cache, name=name, annotations=annotations)]
    return [daemon_daemonset(cache, k, nodes, name, annotations) for k, nodes in enumerate(slots) if nodes]


def slot_base(daemonset: dict[str, Any]) -> str:
    """The base name of a slot DaemonSet (``<base>-<slot>``): one per generation's set of slots."""
    return str(daemonset["metadata"]["name"]).rsplit("-", 1)[0]


def blue_green_name(cache: WeightCache) -> str:
    """The name of a DaemonSet started next to the serving one for a blue/green generation change
    (two DaemonSets cannot share a name, and one DaemonSet runs one pod per node)."""
    return f"{CacheRef.of(cache).daemon_name}-{daemon_spec_hash(cache)[:10]}"


def daemon_daemonset(
    cache: WeightCache,
    slot: int | None = None,
    nodes: list[str] | None = None,
    name: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The DaemonSet for ``cache``; with ``slot``, the one holding that slot's ranks on ``nodes``.
    ``name``: the DaemonSet's name when not the default (``blue_green_name``, or the name of the
    DaemonSet a node-by-node change updates in place; with ``slot``, the base ``-<slot>`` is
    appended to); ``annotations``: added to its metadata (how the generation change that made it
    was decided)."""
    ref = CacheRef.of(cache)
    spec = cache.spec
    ranks = local_ranks(cache, slot or 0)
    spec_hash = daemon_spec_hash(cache)
    labels = ref.labels("daemon")
    name = name or ref.daemon_name
    if slot is not None:
        labels[SLOT_LABEL] = str(slot)
        name = f"{name}-{slot}"
    model_vol, model_mount = model_volume(cache)
    sock_vol, sock_mount = socket_volume(ref, daemon_spec_hash(cache))
    gpu = spec.daemon.backend in GPU_BACKENDS
    holder = uses_gpu_holder(cache)
    profile = profiles.profile_of(cache)
    read_only_root = profile.daemon_read_only_root(cache)

    daemon_cmd = [*CLI, "daemon", *daemon_args(cache, ranks).to_argv(), *spec.daemon.extra_args]
    daemon: dict[str, Any] = {
        "name": "daemon",
        "image": spec.daemon.image,
        "command": daemon_cmd,
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            *profile.daemon_env(cache),
        ],
        "ports": [{"name": STATUS_PORT_NAME, "containerPort": STATUS_PORT, "protocol": "TCP"}],
        "volumeMounts": [model_mount, dict(sock_mount)],
        "securityContext": container_security(read_only_root=read_only_root),
        "readinessProbe": {
            # The launcher's status endpoint answers it with the check `weightcache probe` runs
            # (the GPU holder's grant included): no process start per period, which a busy node
            # delayed past the timeout when this was an exec probe (status_endpoint.py).
            "httpGet": {"path": "/ready", "port": STATUS_PORT_NAME},
            "periodSeconds": 2,
            "timeoutSeconds": 5,
            # Engines that mapped their weights keep their gate through a daemon outage anyway
            # (gates.py), so a slower verdict costs only new engines' start.
            "failureThreshold": 3,
        },
    }
    resources = _daemon_resources(cache) if gpu or spec.daemon.resources else None
    if resources:
        daemon["resources"] = resources
    volumes = [model_vol, sock_vol]
    if read_only_root:
        # The launcher keeps its ranks' exit messages and status notes in a temporary directory,
        # which the read-only root cannot hold.
        scratch_vol, scratch_mount, tmpdir = scratch_volume()
        daemon["env"].insert(1, tmpdir)
        daemon["volumeMounts"].append(scratch_mount)
        volumes.append(scratch_vol)
    owned = [dict(sock_mount)]
    if profile.uses_artifacts(cache):
        artifact_vol, artifact_mount = daemon_artifact_volume(cache)
        daemon["volumeMounts"].append(artifact_mount)
        volumes.append(artifact_vol)
        owned.append(dict(artifact_mount))
    if uses_seeding(cache):
        # The peers file and the credential are mounted, not hashed into the template: a new
        # Ready daemon rewrites the peers file, which must roll no daemon (render/seeding.py).
        daemon["env"].insert(1, NODE_NAME_ENV)
        daemon["ports"].append(seed_port())
        seed_vols, seed_mounts = seed_volumes(cache)
        daemon["volumeMounts"] += seed_mounts
        volumes += seed_vols
    if holder:
        # Every device of the node is visible; the grant says which ones are ours (by UUID).
        daemon["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})
        gpus_vol, gpus_mount = gpus_volume(ref, read_only=True)
        daemon["volumeMounts"].append(gpus_mount)
        volumes.append(gpus_vol)

    containers = [explain_exits(daemon)]
    if spec.daemon.backend in FD_BACKENDS:
        # A sidecar, so the arena outlives a crashed daemon container in the same pod.
        containers.insert(
            0,
            explain_exits(
                {
                    "name": "keeper",
                    "image": spec.daemon.image,
                    "command": [*CLI, "keeper", *KeeperArgs(socket_dir=SOCKET_MOUNT).to_argv()],
                    "volumeMounts": [dict(sock_mount)],
                    "securityContext": container_security(read_only_root=True),
                }
            ),
        )

    pod_spec: dict[str, Any] = {
        **placement_fields(cache),
        "terminationGracePeriodSeconds": 30,
        # The plan first: a spec the daemon would refuse, or ranks that cannot fit, stop the pod here,
        # before any rank process starts (plan.py).
        "initContainers": [
            owner_init(spec.daemon.image, owned),
            *([plan_init(cache, ranks, model_mount)] if profile.plans(cache) else []),
        ],
        "containers": containers,
        "volumes": volumes,
    }
    if uses_dra(cache):
        pod_spec["resourceClaims"] = daemon_claim_fields(cache)
    if slot is not None:
        pin_to_nodes(pod_spec, nodes or [])
    if spec.daemon.backend == "cuda-ipc":
        # Legacy CUDA IPC handles open only across shared PID and IPC namespaces.
        pod_spec["hostIPC"] = True
        pod_spec["hostPID"] = True

    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": name,
            "namespace": ref.namespace,
            "labels": labels,
            "annotations": {**(annotations or {}), SPEC_HASH_ANNOTATION: spec_hash},
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "selector": {
                "matchLabels": {
                    k: labels[k]
                    for k in ("weightcache.io/cache", "weightcache.io/component", SLOT_LABEL)
                    if k in labels
                }
            },
            # nodes = 1: the operator replaces daemon pods itself, node by node after draining the
            # node's engines (rollout/generation.py); the DaemonSet controller would not wait for the drain.
            # Slot DaemonSets (engine groups) still roll by themselves.
            "updateStrategy": {"type": "OnDelete"}
            if cache.spec.parallelism.nodes == 1
            else {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {
                    "labels": {**labels, SPEC_HASH_LABEL: spec_hash},
                    "annotations": {SPEC_HASH_ANNOTATION: spec_hash},
                },
                "spec": pod_spec,
            },
        },
    }


def daemon_args(cache: WeightCache, ranks: list[int]) -> DaemonArgs:
    """The flags of a daemon pod holding ``ranks`` (``spec.daemon.extraArgs`` follow them)."""
    spec = cache.spec
    profile = profiles.profile_of(cache)
    return DaemonArgs(
        model=MODEL_MOUNT,
        name=CacheRef.of(cache).name,
        socket_dir=SOCKET_MOUNT,
        backend=spec.daemon.backend,
        tp_size=spec.parallelism.tensor,
        pp_size=spec.parallelism.pipeline,
        ranks=tuple(ranks),
        keeper="auto" if spec.daemon.backend in FD_BACKENDS else "off",
        # The pod IP only: the endpoint is for the operator and Prometheus, not for the node's
        # other network namespaces (hostNetwork pods) to find on every interface.
        status_addr=f"$(POD_IP):{STATUS_PORT}",
        gpus_file=GPUS_FILE if uses_gpu_holder(cache) else None,
        profile=profile.load_profile,
        **seed_daemon_args(cache),
        # What the profile loads by (dtype, quantization, ... or its engine's own arguments).
        **profile.daemon_args(cache),
    )


def _daemon_resources(cache: WeightCache) -> dict[str, Any]:
    """The user's resources; with ``gpuAccess: dra`` plus the claim from ``claim_template_name``
    (ranks per node devices). On other GPU backends without their ``nvidia.com/gpu``: the GPU
    holder requests that count (``gpu_holder.gpus_per_node``), so that the daemon pods of two
    generations can run on the same GPUs."""
    resources = copy.deepcopy(cache.spec.daemon.resources or {})
    if uses_dra(cache):
        resources["claims"] = container_claims()
    elif uses_gpu_holder(cache):
        for kind in ("limits", "requests"):
            if kind in resources:
                resources[kind] = {k: v for k, v in (resources[kind] or {}).items() if k != GPU_RESOURCE}
                if not resources[kind]:
                    del resources[kind]
    return resources
