"""Which caches have engine pods on which node, as of each cache's latest pass, so a node's Ready
flip finds the caches to fail over without listing pods (a cluster-wide LIST per node event
costs the API server in proportion to the fleet).

Every engine pod change runs a pass of its cache (handlers.on_pod), and each pass records its
cache's engine pods here before it reads the nodes (snapshot.observe): a flip the record missed
happened before that pass read the node index, so that pass already saw the node NotReady.
"""

from __future__ import annotations

import threading

from weightcache_operator.objects import Object, PodView


class EngineNodes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[tuple[str, str], frozenset[str]] = {}

    def record(self, cache: tuple[str, str], engine_pods: list[Object]) -> None:
        nodes = frozenset(node for pod in engine_pods if (node := PodView(pod).node))
        with self._lock:
            self._nodes[cache] = nodes

    def forget(self, cache: tuple[str, str]) -> None:
        with self._lock:
            self._nodes.pop(cache, None)

    def caches_on(self, node: str) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(cache for cache, nodes in self._nodes.items() if node in nodes)
