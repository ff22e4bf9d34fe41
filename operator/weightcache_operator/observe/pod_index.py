"""Each cache's pods as the operator's pod watch delivered them, so that the passes pod and node
events trigger send no LIST of pods: the API server answers a LIST of a namespace's pods by
label from all the pods of the namespace, however few the cache has, and a fleet's pod events
trigger many passes (docs/benchmarks.md, scale).

Fed by kopf (handlers.py): an index handler on the labelled pods puts each pod it is given, from
the initial listing on (kopf runs no handler before that listing is through); the pod event
handler removes deleted pods before the pass that their deletion triggers, and tells of each
listing (kopf lists when a watch starts or restarts).

A pass reads a cache's pods from here only when the index holds everything that cache's own
passes wrote (``view``): a pod a pass created or patched must show the resourceVersion the API
server answered, or a newer one, and a pod it deleted its deletion or its absence. Until the watch
has delivered those, on every full pass (spec change, resync, taking over), and after the watch
listed until a LIST has checked the cache, the pass LISTs instead; the LIST removes pods the
watch never said were deleted (a watch that broke and listed again reports no deletions from the
gap). A LIST that saw pods newer than the index makes the next pass wait for the watch as for a
write, and a pass that failed makes the next one LIST (a create whose answer was lost may have
happened). So no pass decides on a view older than its predecessor's writes or reads: none
creates an engine twice or misses one it deleted.
"""

from __future__ import annotations

import threading

from weightcache_operator.objects import Object
from weightcache_operator.vocabulary import CACHE_LABEL

Key = tuple[str, str]
"""(namespace, cache name)."""

DELETED = -1
"""An expectation that a pod shows its deletion (or is gone), not a resourceVersion."""


def version(obj: Object) -> int:
    """An object's resourceVersion as a number: etcd's revision, which only grows. Kubernetes calls
    it opaque, so one that is not a number counts as 0: nothing is ever taken as new enough by it,
    and passes LIST."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else 0


def cache_of(pod: Object) -> Key | None:
    metadata = pod.get("metadata") or {}
    cache = (metadata.get("labels") or {}).get(CACHE_LABEL)
    namespace = metadata.get("namespace")
    return (namespace, cache) if namespace and cache else None


TOMBSTONES = 256
"""UIDs of deleted pods remembered per cache: a pass that deleted or patched a pod learns from
them that the watch has told of its deletion already (kopf hands each pod's events to its own
worker, so a pod's deletion can be handled before the pass that caused it records what it
expects). By UID: a multi-node group's pods have fixed names, and a name can come back."""


class PodIndex:
    """Written from kopf's threads and by passes, read by passes: every read returns a new list,
    and pods are replaced, never changed in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pods: dict[Key, dict[str, Object]] = {}
        self._gone: dict[Key, dict[str, None]] = {}
        """Per cache, the UIDs of the latest ``TOMBSTONES`` pods deleted, oldest first."""
        self._expected: dict[Key, dict[str, tuple[str, int]]] = {}
        """Per cache, pod name → (its UID, the resourceVersion its passes' last write of it
        answered, or ``DELETED``), until the watch delivers it."""
        self._checked: set[Key] = set()
        """Caches whose pods a LIST has checked since the watch last listed (``relisted``)."""

    # --- the watch ---------------------------------------------------------------------------------

    def put(self, pod: Object) -> None:
        key, name = cache_of(pod), pod["metadata"]["name"]
        if key is None:
            return
        with self._lock:
            self._pods.setdefault(key, {})[name] = pod
            expected = self._expected.get(key, {})
            if name in expected and _meets(pod, *expected[name]):
                del expected[name]

    def remove(self, pod: Object) -> None:
        """A pod the watch says was deleted: gone, and anything a pass expected of it is past."""
        key = cache_of(pod)
        if key is not None:
            with self._lock:
                self._bury(key, pod)

    def relisted(self) -> None:
        """The watch (re)started with a listing: pods deleted while it was away may still be held,
        so each cache is read by LIST again until one has checked it (``listed``)."""
        with self._lock:
            self._checked.clear()

    # --- the passes --------------------------------------------------------------------------------

    def wrote(self, key: Key, pod: Object) -> None:
        """A pod a pass created or patched, as the API server answered."""
        self._expect(key, pod, version(pod))

    def deleting(self, key: Key, pod: Object) -> None:
        """A pod a pass deleted (as the pass saw it before)."""
        self._expect(key, pod, DELETED)

    def view(self, key: Key) -> list[Object] | None:
        """The cache's pods in name order, or None while a write of its passes has not come back
        through the watch, or no LIST has checked them since the watch listed (the pass LISTs
        then)."""
        with self._lock:
            if self._expected.get(key) or key not in self._checked:
                return None
            held = self._pods.get(key, {})
            return [held[name] for name in sorted(held)]

    def unchecked(self, key: Key) -> None:
        """The cache's next pass LISTs (its last one failed: a write may have gone unrecorded)."""
        with self._lock:
            self._checked.discard(key)

    def listed(self, key: Key, pods: list[Object], at: int) -> None:
        """A LIST of the cache's pods, consistent at resourceVersion ``at``: a pod held here that
        it lacks, and no newer than it, was deleted while the watch was away; a pod it has newer
        than held here is expected from the watch like a write (the next pass decides on a view
        at least as new as this one)."""
        present = {pod["metadata"]["name"] for pod in pods}
        with self._lock:
            held = self._pods.get(key, {})
            for pod in [p for n, p in held.items() if n not in present and version(p) <= at]:
                self._bury(key, pod)
            self._checked.add(key)
        for pod in pods:
            self._expect(key, pod, version(pod))

    # --- under the lock --------------------------------------------------------------------------------

    def _expect(self, key: Key, pod: Object, want: int) -> None:
        name, uid = pod["metadata"]["name"], str(pod["metadata"].get("uid") or "")
        with self._lock:
            held = self._pods.get(key, {}).get(name)
            if uid in self._gone.get(key, {}) or (held is not None and _meets(held, uid, want)):
                self._expected.get(key, {}).pop(name, None)  # the watch has told of it already
            else:
                self._expected.setdefault(key, {})[name] = (uid, want)

    def _bury(self, key: Key, pod: Object) -> None:
        name, uid = pod["metadata"]["name"], str(pod["metadata"].get("uid") or "")
        held = self._pods.get(key, {})
        if name in held and held[name]["metadata"].get("uid") == pod["metadata"].get("uid"):
            del held[name]
        expected = self._expected.get(key, {})
        if name in expected and expected[name][0] == uid:
            del expected[name]
        gone = self._gone.setdefault(key, {})
        gone[uid] = None
        while len(gone) > TOMBSTONES:
            del gone[next(iter(gone))]


def _meets(pod: Object, uid: str, want: int) -> bool:
    """Whether ``pod`` (the newest copy of its name) shows what a pass's write of the pod ``uid``
    expects: the same pod, deleting or at least as new as the write."""
    if pod["metadata"].get("uid") != uid:
        return False
    if want == DELETED:
        return bool(pod["metadata"].get("deletionTimestamp"))
    return version(pod) >= want > 0
