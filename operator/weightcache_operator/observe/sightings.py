"""When the operator first saw each engine failure, on its own clock: what failover detection
is measured from (``status.lastFailover.detectionMs``).

The API server stamps failures (``deletionTimestamp``, ``finishedAt``, a condition's
``lastTransitionTime``) to the whole second, truncated, so "API stamp → pass" reads up to a
second more than the operator took. The operator times its own observations to the microsecond:
a watch event's arrival (the kopf handler's entry), one of its own probes (responsiveness.py),
the start of one of its passes. This keeps, per engine pod (uid), the earliest of those that
showed the pod failing:

- a pod's watch event that shows it failing by its own state (failures.failure_of without node
  or probe verdicts: deleted, terminal, a container exited, Ready or the gate turned False);
- for ``NodeNotReady``, the arrival of the node's event that showed it not Ready;
- for ``Unresponsive``, the send of the first probe the engine left unanswered (``Failure.seen``);
- otherwise the pass that first saw it (a readiness gate the pass closed itself).

A sighting lasts while the pod keeps failing, so a pod that recovers and fails again is timed
afresh: a pass that sees it failing no more drops it (if recorded before that pass read the
cluster: a later one may be newer than what it read), and so does a watch event that shows the pod
Ready and failing no more, for the sightings events made. A pod gone from a pass's reading is
dropped likewise. Held in memory only: an operator that starts, or takes over
through peering, after a failure first sees it at its own start; ``failureApiSecond`` tells how
old the failure already was then. Thread-safe: kopf's handler threads and the passes share it.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from weightcache_operator.objects import Object, PodView, pod_ready
from weightcache_operator.observe.failures import failure_of
from weightcache_operator.vocabulary import COMPONENT_LABEL


@dataclass(frozen=True)
class _Seen:
    at: datetime
    by_event: bool
    """Recorded from a pod's own watch event: a pod-local failure, which that pod's next event
    showing it Ready and failing no more ends."""


class Sightings:
    """Per cache (a hashable key): engine pod uid → the operator's first sight of it failing."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[Hashable, dict[str, _Seen]] = {}
        self._nodes: dict[str, datetime] = {}
        """Node → when its event first showed it not Ready (until one shows it Ready again)."""

    def pod_event(self, key: Hashable, pod: Object, at: datetime) -> None:
        """A watch event of one of ``key``'s pods arrived at ``at``; only engine pods count."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if not uid or (meta.get("labels") or {}).get(COMPONENT_LABEL) != "engine":
            return
        failing = failure_of(pod, {}) is not None
        with self._lock:
            seen = self._pods.setdefault(key, {})
            old = seen.get(uid)
            if failing:
                if old is None or at < old.at:
                    seen[uid] = _Seen(at, True)
            elif old is not None and old.by_event and pod_ready(pod):
                del seen[uid]

    def node_event(self, node: str, ready: bool | None, at: datetime) -> None:
        """A node's watch event arrived at ``at``: Ready or not; None when the node was deleted
        (no pod is ``NodeNotReady`` on a node that does not exist)."""
        with self._lock:
            if ready is False:
                self._nodes.setdefault(node, at)
            else:
                self._nodes.pop(node, None)

    def saw(
        self,
        key: Hashable,
        pods: Iterable[Object],
        unready_nodes: Mapping[str, datetime | None],
        unresponsive: Mapping[str, datetime],
        started: datetime,
        at: datetime,
    ) -> None:
        """A pass that began at ``started``, before it read the cluster, saw ``pods`` (all of
        ``key``'s engine pods) at ``at``, with the node and probe verdicts it plans with."""
        with self._lock:
            seen = self._pods.setdefault(key, {})
            present = set()
            for pod in pods:
                uid = pod["metadata"].get("uid")
                if not uid:
                    continue
                present.add(uid)
                old = seen.get(uid)
                failure = failure_of(pod, unready_nodes, unresponsive)
                if failure is None:
                    if old is not None and old.at < started:
                        del seen[uid]
                    continue
                first = [at, *([old.at] if old else []), *([failure.seen] if failure.seen else [])]
                node = PodView(pod).node
                if failure.signal == "NodeNotReady" and node in self._nodes:
                    first.append(self._nodes[node])
                seen[uid] = _Seen(min(first), old.by_event if old else False)
            for uid in [u for u, s in seen.items() if u not in present and s.at < started]:
                del seen[uid]

    def first(self, key: Hashable, pods: Iterable[Object]) -> datetime | None:
        """The operator's first sight of any of ``pods`` failing (an engine group fails with its
        first failed pod); None when it saw none of them failing."""
        with self._lock:
            seen = self._pods.get(key, {})
            found = [s.at for p in pods if (s := seen.get(p["metadata"].get("uid") or "")) is not None]
        return min(found) if found else None

    def forget(self, key: Hashable) -> None:
        """The cache is gone (or no longer ours)."""
        with self._lock:
            self._pods.pop(key, None)
