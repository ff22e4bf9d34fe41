"""The one apply step every kind the operator owns goes through: server-side apply only when
the object the pass wants differs from the one the API holds, so a resync of an unchanged cache
sends no write.

"Differs" is two checks, each covering what the other cannot see:
- the hash of the wanted object, recorded on the live one at its last apply: a field the
  operator stopped rendering changes the hash (a subset check alone would keep the stale field,
  which a server-side apply removes);
- every wanted field present in the live object with the wanted value: someone editing an owned
  field by hand (``kubectl edit``) makes the live object differ though the hash still matches,
  and the next apply puts it back. Fields the API server adds (defaults, status, its own
  metadata) are not wanted, so they never count as a difference.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from weightcache_operator.kubeapi import KubeApi
from weightcache_operator.objects import Object

APPLIED_HASH_ANNOTATION = "weightcache.io/applied-hash"


def applied_hash(wanted: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(wanted, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def contains(live: Any, wanted: Any) -> bool:
    """Every field of ``wanted`` is in ``live`` with the same value; lists match element by
    element (same length: an element the operator no longer wants is a difference)."""
    if isinstance(wanted, Mapping):
        return isinstance(live, Mapping) and all(k in live and contains(live[k], v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return isinstance(live, list) and len(live) == len(wanted) and all(map(contains, live, wanted))
    return bool(live == wanted)


def stamped(wanted: Object) -> Object:
    """``wanted`` with its own hash among its annotations: what is applied."""
    meta = wanted.get("metadata") or {}
    annotations = {**(meta.get("annotations") or {}), APPLIED_HASH_ANNOTATION: applied_hash(wanted)}
    return {**wanted, "metadata": {**meta, "annotations": annotations}}


IDENTITY = ("apiVersion", "kind")
"""Not compared: the request's path names them, and the items of a LIST (how a pass observes
DaemonSets) leave them out."""


def up_to_date(live: Object | None, wanted: Object) -> bool:
    """The live object needs no apply for ``wanted``."""
    body = {k: v for k, v in stamped(wanted).items() if k not in IDENTITY}
    return live is not None and contains(live, body)


def apply_if_different(api: KubeApi, path: str, wanted: Object, live: Object | None) -> Object:
    """The object as the API holds it after the pass: ``live`` unchanged when it is up to date,
    else the answer of a server-side apply of ``wanted``."""
    if live is not None and up_to_date(live, wanted):
        return live
    return api.apply(path, stamped(wanted))
