"""The GPU holder DaemonSet ``<name>-gpus``: the pods that book a cache's GPUs (GPU backends
without ``gpuAccess: dra``).

The scheduler's books and GPU memory are two different things. A pod that requests
``nvidia.com/gpu`` owns those GPUs in the books, and no second pod gets them while it runs; but
what keeps weights in GPU memory is the daemon process (and its keeper), which needs only to see
the device. When daemon pods requested their own GPUs, a second generation's daemon pod could
never be placed on a node whose GPUs the first one held, so a generation change had to go node by
node. Here one holder pod per node requests the GPUs (``ranks_per_node``, or the larger count the
user asks for in ``spec.daemon.resources``) and writes their UUIDs to the per-cache host directory
(``weightcache gpu-holder``); daemon pods of every generation request none, see every device
(``NVIDIA_VISIBLE_DEVICES=all``) and put local rank ``i`` on the grant's ``i``-th GPU, by UUID.
Two generations then share the booked GPUs, and blue/green needs only the memory to fit.

The holder's DaemonSet is ``OnDelete``: a changed template (a new daemon image) never replaces a
holder pod by itself, because a holder pod that goes un-books the GPUs under running daemons. Only
a change of the GPU count needs new holder pods; the operator deletes a node's stale holder pod
when it replaces that node's daemon in a node-by-node change (``stale_holder``), and never picks
blue/green for such a change (``blue_green_blocker``).
"""

from __future__ import annotations

from typing import Any

from weightcache_contract.backends import GPU_BACKENDS

from weightcache_operator.render.dra import uses_dra
from weightcache_operator.render.layout import explain_exits, pin_to_nodes, placement_fields
from weightcache_operator.render.security import container_security, owner_init
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CLI, CacheRef

GPU_RESOURCE = "nvidia.com/gpu"
HOLDER_COMPONENT = "gpu-holder"
GPUS_ANNOTATION = "weightcache.io/gpus-per-node"
"""On holder pods: how many GPUs the pod requested, so a stale one can be told apart."""
GPUS_VOLUME = "weightcache-gpus"
GPUS_MOUNT = "/weightcache/gpus"
"""Where holder (read-write) and daemons (read-only) see the per-cache host directory. The
directory, not the file: the grant is replaced by a rename, which a file bind mount would hide."""
GPUS_FILE = f"{GPUS_MOUNT}/gpus.json"


def uses_gpu_holder(cache: WeightCache) -> bool:
    """GPU backends book their GPUs through the holder, except with ``gpuAccess: dra``, where each
    daemon pod's ResourceClaim does (and engines share that claim)."""
    return cache.spec.daemon.backend in GPU_BACKENDS and not uses_dra(cache)


def holder_name(ref: CacheRef) -> str:
    return f"{ref.name}-gpus"


def gpus_per_node(cache: WeightCache) -> int:
    """``ranks_per_node``, or the user's explicit ``nvidia.com/gpu`` count (limits, else requests);
    validation refuses a count below ``ranks_per_node``."""
    resources = cache.spec.daemon.resources or {}
    for kind in ("limits", "requests"):
        asked = (resources.get(kind) or {}).get(GPU_RESOURCE)
        if asked is not None:
            return int(str(asked))
    return cache.spec.parallelism.ranks_per_node


def gpus_volume(ref: CacheRef, read_only: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The per-cache host directory (``CacheRef.cache_host_dir``) and its mount at GPUS_MOUNT."""
    volume = {"name": GPUS_VOLUME, "hostPath": {"path": ref.cache_host_dir, "type": "DirectoryOrCreate"}}
    mount: dict[str, Any] = {"name": GPUS_VOLUME, "mountPath": GPUS_MOUNT}
    if read_only:
        mount["readOnly"] = True
    return volume, mount


def gpu_holder_daemonset(cache: WeightCache, slots: list[list[str]]) -> dict[str, Any] | None:
    """The holder DaemonSet, on the daemons' nodes: the placement, and with ``nodes > 1`` only the
    nodes some slot was assigned (``slots``, as for ``daemon_daemonsets``). None when the cache
    books no GPUs this way, or no node may run a daemon."""
    if not uses_gpu_holder(cache):
        return None
    ref = CacheRef.of(cache)
    labels = ref.labels(HOLDER_COMPONENT)
    count = gpus_per_node(cache)
    volume, mount = gpus_volume(ref, read_only=False)

    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    holder = {
        "name": "gpu-holder",
        "image": cache.spec.daemon.image,
        "command": [*CLI, "gpu-holder", "--out", GPUS_FILE, "--expect", str(count)],
        "env": [
            {"name": "POD_NAME", "valueFrom": field("metadata.name")},
            {"name": "POD_UID", "valueFrom": field("metadata.uid")},
            {"name": "NODE_NAME", "valueFrom": field("spec.nodeName")},
        ],
        # Extended resources need request = limit. It sleeps: a sliver of CPU and memory.
        "resources": {
            "limits": {GPU_RESOURCE: str(count)},
            "requests": {GPU_RESOURCE: str(count), "cpu": "10m", "memory": "64Mi"},
        },
        "volumeMounts": [mount],
        "securityContext": container_security(read_only_root=True),
    }
    pod_spec: dict[str, Any] = {
        **placement_fields(cache),
        "terminationGracePeriodSeconds": 10,
        # It writes the grant and its lock into the per-cache host directory.
        "initContainers": [owner_init(cache.spec.daemon.image, [mount])],
        "containers": [explain_exits(holder)],
        "volumes": [volume],
    }
    if cache.spec.parallelism.nodes > 1:
        nodes = sorted({node for slot in slots for node in slot})
        if not nodes:
            return None
        pin_to_nodes(pod_spec, nodes)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": holder_name(ref),
            "namespace": ref.namespace,
            "labels": labels,
            "ownerReferences": [ref.owner_reference()],
        },
        "spec": {
            "selector": {"matchLabels": {k: labels[k] for k in ("weightcache.io/cache", "weightcache.io/component")}},
            "updateStrategy": {"type": "OnDelete"},
            "template": {
                "metadata": {"labels": dict(labels), "annotations": {GPUS_ANNOTATION: str(count)}},
                "spec": pod_spec,
            },
        },
    }


def reads_grant(daemonset: dict[str, Any]) -> bool:
    """Whether a daemon DaemonSet's pods put their weights on the holder's GPUs (they mount its
    grant): while one exists, the holder must stay, whatever the spec says now."""
    volumes = ((daemonset.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes") or []
    return any(v.get("name") == GPUS_VOLUME for v in volumes)


def requests_own_gpus(pod: dict[str, Any]) -> bool:
    """Whether a daemon pod requests ``nvidia.com/gpu`` itself (one started before the holder
    existed): its GPUs are booked to it alone."""
    return any(
        GPU_RESOURCE in ((c.get("resources") or {}).get(kind) or {})
        for c in (pod.get("spec") or {}).get("containers") or []
        for kind in ("limits", "requests")
    )


def stale_holder(cache: WeightCache, holder: dict[str, Any]) -> bool:
    """Whether a holder pod books another number of GPUs than ``cache`` needs per node."""
    annotations = holder["metadata"].get("annotations") or {}
    return uses_gpu_holder(cache) and annotations.get(GPUS_ANNOTATION) != str(gpus_per_node(cache))


def blue_green_blocker(cache: WeightCache, daemons: list[dict[str, Any]], holders: list[dict[str, Any]]) -> str | None:
    """Why the new generation ``cache`` asks for could not share the serving daemons' GPUs, or
    None when the holder books them for both. ``daemons``: the serving daemon pods; ``holders``:
    the holder pods."""
    for pod in sorted(daemons, key=lambda p: p["metadata"]["name"]):
        if requests_own_gpus(pod):
            return (
                f"daemon pod {pod['metadata']['name']} requests {GPU_RESOURCE} itself (it predates the GPU holder),"
                " so no second daemon can be placed on its GPUs"
            )
    for pod in sorted(holders, key=lambda p: p["metadata"]["name"]):
        if stale_holder(cache, pod):
            had = (pod["metadata"].get("annotations") or {}).get(GPUS_ANNOTATION, "?")
            return (
                f"the GPUs per node change ({had} → {gpus_per_node(cache)}): the GPU holder pods must be replaced,"
                " which only a node-by-node change does"
            )
    return None
