"""The cluster's nodes as the operator's node watch last delivered them, so a pass reads no
object whose count grows with the fleet: a LIST of every node per pass costs the API server and
the operator O(nodes) on each pod event, and a 500-node cluster sends many.

Fed by kopf (handlers.py): an index handler on nodes puts every node it is given, and kopf runs
no handler of any resource until the initial listing of every indexed resource is through, so no
pass ever sees a partial fleet (a multi-node engine's slots are assigned over the nodes a pass
sees). The node event handler removes deleted nodes. Only what passes read is kept of each node:
its name, labels, spec (taints, unschedulable) and conditions; capacity, images and nodeInfo,
most of a Node's bytes, are dropped.
"""

from __future__ import annotations

import threading

from weightcache_operator.objects import Object

_KEPT_METADATA = ("name", "uid", "resourceVersion", "labels", "annotations")


def slim(node: Object) -> Object:
    """The parts of a Node object passes read (placement: labels and taints; failover: conditions)."""
    metadata = node.get("metadata") or {}
    return {
        "metadata": {k: metadata[k] for k in _KEPT_METADATA if k in metadata},
        "spec": dict(node.get("spec") or {}),
        "status": {"conditions": list((node.get("status") or {}).get("conditions") or [])},
    }


class NodeIndex:
    """Node name → its slim copy. Written from kopf's threads, read by passes in others: every
    read returns a copy of the list, and entries are replaced, never changed in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, Object] = {}

    def put(self, node: Object) -> None:
        kept = slim(node)
        with self._lock:
            self._nodes[kept["metadata"]["name"]] = kept

    def remove(self, name: str) -> None:
        with self._lock:
            self._nodes.pop(name, None)

    def nodes(self) -> list[Object]:
        """Every node known, in name order (placement decisions must not depend on event order)."""
        with self._lock:
            return [self._nodes[name] for name in sorted(self._nodes)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._nodes)
