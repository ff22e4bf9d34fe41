"""Each cache's objects of one kind (pods, DaemonSets, Services, disruption budgets) as the
operator's watch of that kind delivered them, so that most passes send no request for them: the
API server answers a LIST of a namespace's pods by label from all the pods of the namespace,
however few the cache has, a fleet's pod events trigger many passes (docs/benchmarks.md, scale),
and each request of a pass waits on a busy API server.

Fed by kopf (handlers.py), one index per kind: an index handler on the labelled objects puts each
object it is given, from the initial listing on (kopf runs no handler before that listing is
through); the kind's event handler removes deleted objects (for pods before the pass that their
deletion triggers), and tells of each listing (kopf lists when a watch starts or restarts).

A pass reads a cache's objects of a kind from here only when the index holds everything that
cache's own passes wrote (``view``): an object a pass created, applied or patched must show the
resourceVersion the API server answered, or a newer one, and an object it deleted its deletion or
its absence. Until the watch has delivered those, on every full pass (spec change, resync, taking
over), and after the watch listed until a LIST has checked the cache, the pass LISTs instead; the
LIST removes objects the watch never said were deleted (a watch that broke and listed again
reports no deletions from the gap). A LIST that saw objects newer than the index makes the next
pass wait for the watch as for a write, and a pass that failed makes the next one LIST (a create
whose answer was lost may have happened). So no pass decides on a view older than its
predecessor's writes or reads: none creates an engine twice or misses one it deleted, nor applies
a DaemonSet, Service or budget from a view older than its own last apply.
"""

from __future__ import annotations

import threading

from weightcache_operator.objects import Object
from weightcache_operator.vocabulary import CACHE_LABEL, CacheKey

DELETED = -1
"""An expectation that an object shows its deletion (or is gone), not a resourceVersion."""


def version(obj: Object) -> int:
    """An object's resourceVersion as a number: etcd's revision, which only grows. Kubernetes calls
    it opaque, so one that is not a number counts as 0: nothing is ever taken as new enough by it,
    and passes LIST."""
    text = str((obj.get("metadata") or {}).get("resourceVersion") or "")
    return int(text) if text.isdigit() else 0


def cache_of(obj: Object) -> CacheKey | None:
    metadata = obj.get("metadata") or {}
    cache = (metadata.get("labels") or {}).get(CACHE_LABEL)
    namespace = metadata.get("namespace")
    return (namespace, cache) if namespace and cache else None


TOMBSTONES = 256
"""UIDs of deleted objects remembered per cache: a pass that deleted or patched an object learns
from them that the watch has told of its deletion already (kopf hands each object's events to its
own worker, so a deletion can be handled before the pass that caused it records what it expects).
By UID: a multi-node group's pods and every DaemonSet have fixed names, and a name can come back."""


class WatchIndex:
    """One kind's objects. Written from kopf's threads and by passes, read by passes: every read
    returns a new list, and objects are replaced, never changed in place."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[CacheKey, dict[str, Object]] = {}
        self._gone: dict[CacheKey, dict[str, None]] = {}
        """Per cache, the UIDs of the latest ``TOMBSTONES`` objects deleted, oldest first."""
        self._expected: dict[CacheKey, dict[str, tuple[str, int]]] = {}
        """Per cache, name → (its UID, the resourceVersion its passes' last write of it
        answered, or ``DELETED``), until the watch delivers it."""
        self._checked: set[CacheKey] = set()
        """Caches whose objects a LIST has checked since the watch last listed (``relisted``)."""

    # --- the watch ---------------------------------------------------------------------------------

    def put(self, obj: Object) -> None:
        key, name = cache_of(obj), obj["metadata"]["name"]
        if key is None:
            return
        with self._lock:
            self._held.setdefault(key, {})[name] = obj
            expected = self._expected.get(key, {})
            if name in expected and _meets(obj, *expected[name]):
                del expected[name]

    def remove(self, obj: Object) -> None:
        """An object the watch says was deleted: gone, and anything a pass expected of it is past."""
        key = cache_of(obj)
        if key is not None:
            with self._lock:
                self._bury(key, obj)

    def relisted(self) -> None:
        """The watch (re)started with a listing: objects deleted while it was away may still be held,
        so each cache is read by LIST again until one has checked it (``listed``)."""
        with self._lock:
            self._checked.clear()

    # --- the passes --------------------------------------------------------------------------------

    def wrote(self, key: CacheKey, obj: Object) -> None:
        """An object a pass created, applied or patched, as the API server answered."""
        self._expect(key, obj, version(obj))

    def deleting(self, key: CacheKey, obj: Object) -> None:
        """An object a pass deleted (as the pass saw it before)."""
        self._expect(key, obj, DELETED)

    def view(self, key: CacheKey) -> list[Object] | None:
        """The cache's objects in name order, or None while a write of its passes has not come back
        through the watch, or no LIST has checked them since the watch listed (the pass LISTs
        then)."""
        with self._lock:
            if self._expected.get(key) or key not in self._checked:
                return None
            held = self._held.get(key, {})
            return [held[name] for name in sorted(held)]

    def unchecked(self, key: CacheKey) -> None:
        """The cache's next pass LISTs (its last one failed: a write may have gone unrecorded)."""
        with self._lock:
            self._checked.discard(key)

    def listed(self, key: CacheKey, objs: list[Object], at: int) -> None:
        """A LIST of the cache's objects, consistent at resourceVersion ``at``: an object held here that
        it lacks, and no newer than it, was deleted while the watch was away; an object it has newer
        than held here is expected from the watch like a write (the next pass decides on a view
        at least as new as this one)."""
        present = {obj["metadata"]["name"] for obj in objs}
        with self._lock:
            held = self._held.get(key, {})
            for obj in [p for n, p in held.items() if n not in present and version(p) <= at]:
                self._bury(key, obj)
            self._checked.add(key)
        for obj in objs:
            self._expect(key, obj, version(obj))

    # --- under the lock --------------------------------------------------------------------------------

    def _expect(self, key: CacheKey, obj: Object, want: int) -> None:
        name, uid = obj["metadata"]["name"], str(obj["metadata"].get("uid") or "")
        with self._lock:
            held = self._held.get(key, {}).get(name)
            if uid in self._gone.get(key, {}) or (held is not None and _meets(held, uid, want)):
                self._expected.get(key, {}).pop(name, None)  # the watch has told of it already
            else:
                self._expected.setdefault(key, {})[name] = (uid, want)

    def _bury(self, key: CacheKey, obj: Object) -> None:
        name, uid = obj["metadata"]["name"], str(obj["metadata"].get("uid") or "")
        held = self._held.get(key, {})
        if name in held and held[name]["metadata"].get("uid") == obj["metadata"].get("uid"):
            del held[name]
        expected = self._expected.get(key, {})
        if name in expected and expected[name][0] == uid:
            del expected[name]
        gone = self._gone.setdefault(key, {})
        gone[uid] = None
        while len(gone) > TOMBSTONES:
            del gone[next(iter(gone))]


def _meets(obj: Object, uid: str, want: int) -> bool:
    """Whether ``obj`` (the newest copy of its name) shows what a pass's write of the object ``uid``
    expects: the same object, deleting or at least as new as the write."""
    if obj["metadata"].get("uid") != uid:
        return False
    if want == DELETED:
        return bool(obj["metadata"].get("deletionTimestamp"))
    return version(obj) >= want > 0


class Watches:
    """The indexes a pass reads from, one per kind it observes; handlers.py feeds each from its
    own watch."""

    def __init__(self) -> None:
        self.pods = WatchIndex()
        self.daemonsets = WatchIndex()
        self.services = WatchIndex()
        self.budgets = WatchIndex()

    def unchecked(self, key: CacheKey) -> None:
        """The cache's next pass LISTs every kind (its last one failed)."""
        for index in (self.pods, self.daemonsets, self.services, self.budgets):
            index.unchecked(key)
