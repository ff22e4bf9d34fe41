"""What every part of the API is built from: the model base class, CEL rule helpers and the
schema pieces more than one part uses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

FreeForm = dict[str, Any]
"""A Kubernetes object the operator passes through unchanged (kept whole by the CRD)."""


Precision = Literal["seconds", "milliseconds", "microseconds"]


def stamp(when: datetime, timespec: Precision = "seconds") -> str:
    """``when`` in RFC 3339, UTC, with a ``Z``: to the second as the API server writes timestamps,
    or finer for the status fields that time what takes less (spec/status.py says which)."""
    return truncated(when, timespec).replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


def truncated(when: datetime, timespec: Precision = "seconds") -> datetime:
    """``when`` in UTC, cut to ``timespec`` as ``stamp`` writes it (a naive time is taken as UTC):
    the time a status field holds once read back, so that a typed status equals its wire form
    parsed and what a pass computes from a time it just set is what the next pass computes."""
    utc = when.astimezone(UTC) if when.tzinfo is not None else when.replace(tzinfo=UTC)
    keep = {"seconds": 0, "milliseconds": utc.microsecond // 1000 * 1000, "microseconds": utc.microsecond}
    return utc.replace(microsecond=keep[timespec])


def cel(rule: str, message: str) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry; kept next to the Python check that mirrors it."""
    return {"rule": rule, "message": message}


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """JSON-schema extra that attaches CEL rules to a model's or a field's schema."""
    return {"x-kubernetes-validations": list(rules)}


def default_object(model: type[BaseModel]) -> dict[str, Any]:
    """Schema extra for a nested object whose fields all have defaults. The API server applies
    nested defaults only when the object exists, and checks an object's default against its CEL
    rules *without* nested defaults, so the default is the whole defaulted object, not ``{}``."""
    return {"default": model().model_dump(by_alias=True, exclude_none=True, mode="json")}


class ApiModel(BaseModel):
    """camelCase on the wire, unknown fields refused: the API server prunes fields its schema
    does not know, so an unknown field reaching the models is a bug or a typo worth naming."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict[str, Any]:
        """As the API holds it: camelCase JSON of the fields that were set (one set to None
        included), every time at its field's precision."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
