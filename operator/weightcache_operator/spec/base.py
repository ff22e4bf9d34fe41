"""What every part of the API is built from: the model base class, CEL rule helpers and the
schema pieces more than one part uses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

FreeForm = dict[str, Any]
"""A Kubernetes object the operator passes through unchanged (kept whole by the CRD)."""


def stamp(when: datetime, timespec: Literal["seconds", "milliseconds", "microseconds"] = "seconds") -> str:
    """``when`` in RFC 3339, UTC, with a ``Z``: to the second as the API server writes timestamps,
    or finer for the status fields that time what takes less (spec/status.py says which)."""
    utc = when.astimezone(UTC) if when.tzinfo is not None else when
    return utc.replace(tzinfo=None).isoformat(timespec=timespec) + "Z"


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


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
