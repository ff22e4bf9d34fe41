"""An in-memory double of the operator's ``KubeApi`` for unit tests: objects kept in dicts by
(kind, namespace, name), each write recorded as a ``Write`` (verb, kind, name, key fields) in the
order the operator sent it. Only what a pass needs of the API server is modelled: GET, LIST by
label or name, create (``generateName`` numbered in order), delete (a pod turns terminating, as
with a grace period; anything else goes at once), JSON merge patches (conditions merged by type
for a strategic merge of a status) and server-side apply (the applied object replaces the spec,
the status is kept). No controllers run: a test moves the cluster on between passes itself
(``put``, ``remove``).

tests/unit/conftest.py puts this folder on ``sys.path``, so test modules import this one as
``recording_kube``.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple

from weightcache_operator.kubeapi import STRATEGIC_MERGE, ApiError, KubeApi
from weightcache_operator.objects import Object

KINDS = {
    "pods": "Pod",
    "services": "Service",
    "daemonsets": "DaemonSet",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "weightcaches": "WeightCache",
    "events": "Event",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "namespaces": "Namespace",
    "inferencepools": "InferencePool",
    "leases": "Lease",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
}
"""The resources a pass touches, by the plural its paths name them with."""


class Write(NamedTuple):
    """One write as the API server received it. ``fields``: the leaves of a patch's body as
    ``path=value`` (a condition as ``conditions.<type>=<status>``); empty for other verbs."""

    verb: str
    kind: str
    name: str
    fields: tuple[str, ...] = ()


Key = tuple[str, str, str]
"""(kind, namespace, name); namespace "" for cluster-wide objects."""


class RecordingKube(KubeApi):
    def __init__(self) -> None:  # no connection: nothing here reaches a server
        self.timed = None
        self.objects: dict[Key, Object] = {}
        self.writes: list[Write] = []
        self.removed: list[tuple[str, Object]] = []
        """(kind, object) of every object ``remove``d, or deleted without a grace period (all
        but pods), since a test last cleared this: what the watches report deleted."""
        self._version = 0
        self._named: dict[str, int] = {}
        """Per kind, how many objects got a name from their ``generateName``: Events come from
        another thread (events.py), so pods are numbered apart from them."""
        self._lock = threading.Lock()  # a pass sends some requests at once (together.py)

    # --- the test's side --------------------------------------------------------------------------

    def put(self, kind: str, obj: Mapping[str, Any], namespace: str = "ns") -> Object:
        """Stores ``obj`` (a copy) as the cluster holds it now; not recorded as a write."""
        with self._lock:
            stored = copy.deepcopy(dict(obj))
            meta = stored.setdefault("metadata", {})
            if kind != "Namespace":
                meta.setdefault("namespace", namespace)
            meta["resourceVersion"] = self._next_version()
            self.objects[(kind, meta.get("namespace", ""), meta["name"])] = stored
            return copy.deepcopy(stored)

    def remove(self, kind: str, name: str, namespace: str = "ns") -> None:
        """The object is gone (a terminating pod finished, a controller deleted it)."""
        with self._lock:
            gone = self.objects.pop((kind, namespace, name), None)
            if gone is not None:
                self.removed.append((kind, gone))

    def stored(self, kind: str, name: str, namespace: str = "ns") -> Object:
        return self.objects[(kind, namespace, name)]

    def names(self, kind: str, namespace: str = "ns") -> list[str]:
        # Under the lock: Events are created on the event sink's thread (events.py) meanwhile.
        with self._lock:
            return sorted(n for k, ns, n in self.objects if k == kind and ns == namespace)

    def steps(self, *, without: tuple[str, ...] = ("Event",)) -> list[tuple[str, str, str]]:
        """(verb, kind, name) of every write in order, but those of kinds ``without`` (Events
        are sent off the pass, events.py: their order to the pass's writes is not the pass's)."""
        with self._lock:
            return [(w.verb, w.kind, w.name) for w in self.writes if w.kind not in without]

    def forget_writes(self) -> None:
        self.writes.clear()

    # --- KubeApi ----------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        verb: str | None = None,
    ) -> Object:
        if method != "GET":
            raise NotImplementedError(f"{method} {path}: use create, delete, patch or apply")
        params = params or {}
        kind, namespace, name, _sub = _parse(path)
        with self._lock:
            if name is None:
                items = [
                    copy.deepcopy(o)
                    for (k, ns, _n), o in sorted(self.objects.items())
                    if k == kind and ns == namespace and _selected(o, params)
                ]
                return {"items": items, "metadata": {"resourceVersion": str(self._version)}}
            found = self.objects.get((kind, namespace, name))
            if found is None:
                raise ApiError(404, {"message": f"{kind.lower()}s {name} not found"})
            return copy.deepcopy(found)

    def create(self, path: str, body: Object) -> Object:
        kind, namespace, _name, _sub = _parse(path)
        with self._lock:
            stored = copy.deepcopy(body)
            meta = stored.setdefault("metadata", {})
            if "name" not in meta:
                self._named[kind] = self._named.get(kind, 0) + 1
                meta["name"] = f"{meta.pop('generateName', 'object-')}{self._named[kind]:05d}"
            meta["namespace"] = namespace
            meta.setdefault("uid", f"uid-{meta['name']}")
            meta["resourceVersion"] = self._next_version()
            key = (kind, namespace, meta["name"])
            if key in self.objects:
                raise ApiError(409, {"message": f"{kind} {meta['name']} already exists"})
            self.objects[key] = stored
            self.writes.append(Write("create", kind, meta["name"]))
            return copy.deepcopy(stored)

    def delete(self, path: str, grace_seconds: int | None = None, propagation: str | None = None) -> None:
        kind, namespace, name, _sub = _parse(path)
        assert name is not None, path
        with self._lock:
            self.writes.append(Write("delete", kind, name))
            key = (kind, namespace, name)
            if key not in self.objects:
                return  # KubeApi.delete takes a 404 as done
            if kind == "Pod":
                meta = self.objects[key]["metadata"]
                meta.setdefault("deletionTimestamp", "2026-11-29T10:00:00Z")
                meta["resourceVersion"] = self._next_version()
            else:
                self.removed.append((kind, self.objects.pop(key)))

    def patch(self, path: str, body: Object, content_type: str = "application/merge-patch+json") -> Object:
        kind, namespace, name, sub = _parse(path)
        assert name is not None, path
        with self._lock:
            shown = name if sub is None else f"{name}/{sub}"
            self.writes.append(Write("patch", kind, shown, tuple(_leaves(body))))
            found = self.objects.get((kind, namespace, name))
            if found is None:
                raise ApiError(404, {"message": f"{kind.lower()}s {name} not found"})
            _merge(found, body, by_type=content_type == STRATEGIC_MERGE)
            found["metadata"]["resourceVersion"] = self._next_version()
            return copy.deepcopy(found)

    def apply(self, path: str, body: Object) -> Object:
        kind, namespace, name, _sub = _parse(path)
        assert name is not None, path
        with self._lock:
            self.writes.append(Write("apply", kind, name))
            before = self.objects.get((kind, namespace, name)) or {}
            stored = copy.deepcopy(body)
            meta = stored.setdefault("metadata", {})
            meta["namespace"] = namespace
            meta["uid"] = (before.get("metadata") or {}).get("uid", f"uid-{name}")
            meta["resourceVersion"] = self._next_version()
            if "status" in before:
                stored["status"] = before["status"]
            self.objects[(kind, namespace, name)] = stored
            return copy.deepcopy(stored)

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)


def _parse(path: str) -> tuple[str, str, str | None, str | None]:
    """(kind, namespace, name or None for a collection, subresource or None) of an API path."""
    parts = path.strip("/").split("/")
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 2:
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces":
        return "Namespace", "", rest[1] if len(rest) > 1 else None, None
    kind = KINDS[rest[0]]
    return kind, namespace, rest[1] if len(rest) > 1 else None, rest[2] if len(rest) > 2 else None


def _selected(obj: Object, params: Mapping[str, Any]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, (params.get("labelSelector") or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    field = params.get("fieldSelector") or ""
    return not field.startswith("metadata.name=") or obj["metadata"]["name"] == field.split("=", 1)[1]


def _merge(target: dict[str, Any], patch: Mapping[str, Any], *, by_type: bool) -> None:
    """A JSON merge patch (None deletes); with ``by_type``, lists of conditions merge by type."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value, by_type=by_type)
        elif by_type and key == "conditions" and isinstance(value, list):
            kept = [c for c in target.get(key) or [] if c.get("type") not in {v.get("type") for v in value}]
            target[key] = kept + copy.deepcopy(value)
        else:
            target[key] = copy.deepcopy(value)


def _leaves(body: Any, prefix: str = "") -> list[str]:
    """``path=value`` for each leaf of a patch body; conditions as ``conditions.<type>=<status>``."""
    if isinstance(body, Mapping):
        if "status" in body and isinstance(body.get("status"), Mapping) and "phase" in body["status"]:
            return [f"status.phase={body['status']['phase']}"]  # a WeightCache status: its phase says enough
        return [leaf for key, value in body.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    if isinstance(body, list) and prefix.endswith("conditions."):
        return [f"{prefix}{c.get('type')}={c.get('status')}" for c in body]
    return [f"{prefix.rstrip('.')}={body}"]
