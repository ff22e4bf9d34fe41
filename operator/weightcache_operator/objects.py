"""Read-only typed views over Kubernetes objects as the API returns them (plain dicts), and the
few conventions every module reads them by: RFC 3339 timestamps, conditions, the daemon spec
hash an object carries. Pure; a view never changes the dict it wraps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from weightcache_operator.spec.base import stamp as stamp  # the API's timestamps, defined with its models
from weightcache_operator.spec.base import truncated as truncated
from weightcache_operator.vocabulary import (
    ENGINE_HASH_LABEL,
    REPLICA_LABEL,
    ROLE_LABEL,
    SLOT_LABEL,
    SPEC_HASH_ANNOTATION,
)

Object = dict[str, Any]
"""A Kubernetes object as the API returns it."""


def parse_time(text: object) -> datetime | None:
    """An RFC 3339 timestamp of the API (``2026-01-02T03:04:05Z``, fractions allowed); None for none."""
    if not text or not isinstance(text, str):
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def find_condition(conditions: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)


def condition(
    kind: str,
    status: bool | str,
    reason: str,
    message: str,
    now: datetime,
    previous: Sequence[Mapping[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A condition in the Kubernetes convention: ``lastTransitionTime`` kept from the previous
    condition of its type unless the status changed. ``extra``: further fields
    (``observedGeneration``), written after the standard ones."""
    text = status if isinstance(status, str) else "True" if status else "False"
    before = find_condition(previous, kind)
    since = before.get("lastTransitionTime") if before is not None and before.get("status") == text else None
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or stamp(now),
        **extra,
    }


class View:
    """What every object has: metadata."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.raw.get("metadata") or {}

    @property
    def name(self) -> str:
        return str(self.meta.get("name", ""))

    @property
    def namespace(self) -> str | None:
        return self.meta.get("namespace")

    @property
    def uid(self) -> str | None:
        return self.meta.get("uid")

    @property
    def labels(self) -> Mapping[str, str]:
        return self.meta.get("labels") or {}

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.meta.get("annotations") or {}

    @property
    def created(self) -> datetime | None:
        return parse_time(self.meta.get("creationTimestamp"))

    @property
    def created_text(self) -> str:
        """The creation timestamp as written: sorts as the time does (one format, one zone)."""
        return str(self.meta.get("creationTimestamp") or "")

    @property
    def deleting(self) -> bool:
        return bool(self.meta.get("deletionTimestamp"))

    @property
    def deletion(self) -> datetime | None:
        """When a deleted object's grace period ends."""
        return parse_time(self.meta.get("deletionTimestamp"))

    @property
    def spec_hash(self) -> str | None:
        """The daemon spec hash a daemon pod or DaemonSet holds, or an engine pod maps."""
        return self.annotations.get(SPEC_HASH_ANNOTATION)

    @property
    def status(self) -> Mapping[str, Any]:
        return self.raw.get("status") or {}

    @property
    def conditions(self) -> list[Mapping[str, Any]]:
        return list(self.status.get("conditions") or [])

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return find_condition(self.conditions, kind)

    def condition_status(self, kind: str) -> str | None:
        found = self.condition(kind)
        return None if found is None else found.get("status")


class PodView(View):
    __slots__ = ()

    @property
    def node(self) -> str | None:
        return (self.raw.get("spec") or {}).get("nodeName")

    @property
    def phase(self) -> str | None:
        return self.status.get("phase")

    @property
    def terminal(self) -> bool:
        return self.phase in ("Failed", "Succeeded")

    @property
    def ready(self) -> bool:
        """Ready condition True and not being deleted (a terminating pod serves no new work)."""
        return not self.deleting and self.condition_status("Ready") == "True"

    @property
    def container_statuses(self) -> list[Mapping[str, Any]]:
        return list(self.status.get("containerStatuses") or [])

    @property
    def ip(self) -> str | None:
        return self.status.get("podIP")

    @property
    def role(self) -> str | None:
        return self.labels.get(ROLE_LABEL)

    @property
    def replica(self) -> int | None:
        text = self.labels.get(REPLICA_LABEL, "")
        return int(text) if text.isdigit() else None

    @property
    def engine_hash(self) -> str | None:
        return self.labels.get(ENGINE_HASH_LABEL)

    @property
    def slot(self) -> int | None:
        text = self.labels.get(SLOT_LABEL, "")
        return int(text) if text.isdigit() else None

    @property
    def owner(self) -> str | None:
        """The name of its controller (a daemon pod's DaemonSet)."""
        return next((o.get("name") for o in self.meta.get("ownerReferences") or [] if o.get("controller")), None)


class NodeView(View):
    __slots__ = ()

    @property
    def ready(self) -> bool:
        return self.condition_status("Ready") == "True"

    @property
    def ready_changed(self) -> datetime | None:
        """When the Ready condition last changed status (None: no Ready condition)."""
        found = self.condition("Ready")
        return parse_time(found.get("lastTransitionTime")) if found else None

    @property
    def cordoned(self) -> bool:
        """``spec.unschedulable``: what ``kubectl cordon`` (and ``kubectl drain``, first) sets."""
        return bool((self.raw.get("spec") or {}).get("unschedulable"))


class DaemonSetView(View):
    __slots__ = ()

    @property
    def desired_scheduled(self) -> int:
        return int(self.status.get("desiredNumberScheduled", 0))


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """``PodView(pod).ready``, for filters over raw pods."""
    return PodView(pod).ready


def conditions_ready(conditions: Sequence[Mapping[str, Any]] | None) -> bool:
    """A Ready condition True among ``conditions`` (a node's, as a watch event hands them over)."""
    found = find_condition(conditions, "Ready")
    return found is not None and found.get("status") == "True"


def spec_hash(obj: Mapping[str, Any]) -> str | None:
    """``View(obj).spec_hash``, for filters over raw objects."""
    return View(obj).spec_hash
