"""What deleting a cache takes: everything it owns deleted, and its pods gone."""

from __future__ import annotations

from weightcache_operator.kubeapi import KubeApi
from weightcache_operator.objects import NodeView, PodView
from weightcache_operator.vocabulary import CACHE_LABEL


class StillTerminating(Exception):
    """Raised by ``finalize`` while pods it asked to stop still run on healthy nodes."""


def finalize(api: KubeApi, namespace: str, name: str) -> None:
    """Deletes everything the cache owns and waits until its pods are gone (their processes,
    keeper arenas included, with them): raises ``StillTerminating`` until then. Pods on a node
    that is gone or NotReady are deleted with grace 0: nobody will ever confirm their stop, and
    deletion must still complete."""
    ref_sel = f"{CACHE_LABEL}={name}"
    ns = f"/api/v1/namespaces/{namespace}"
    for ds in api.list(f"/apis/apps/v1/namespaces/{namespace}/daemonsets", ref_sel):
        api.delete(
            f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{ds['metadata']['name']}", propagation="Background"
        )
    # gpuAccess dra only (a 404, ignored, otherwise); the claims made from it go with their pods.
    api.delete(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates/{name}-gpus")
    for svc in api.list(f"{ns}/services", ref_sel):
        api.delete(f"{ns}/services/{svc['metadata']['name']}")
    healthy = {n.name for n in map(NodeView, api.list("/api/v1/nodes")) if n.ready}
    waiting = []
    for pod in map(PodView, api.list(f"{ns}/pods", ref_sel)):
        if pod.node and pod.node not in healthy:
            api.delete(f"{ns}/pods/{pod.name}", grace_seconds=0)
            continue
        if not pod.deleting:
            api.delete(f"{ns}/pods/{pod.name}")
        waiting.append(pod.name)
    if waiting:
        raise StillTerminating(f"waiting for {len(waiting)} pods to stop: {', '.join(sorted(waiting))}")
