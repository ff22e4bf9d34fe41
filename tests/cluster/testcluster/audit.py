"""The API server's audit log: every write (create, update, patch, delete) the control plane
answered, with who sent it and when (``kcluster up`` writes ``<state dir>/logs/audit.log``,
JSON lines, level Metadata: no bodies; reads, Leases and Events are left out)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


@dataclass(frozen=True)
class Write:
    user: str
    """The authenticated user, e.g. ``system:serviceaccount:<ns>:<name>``."""
    user_agent: str
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    code: int
    received: datetime
    """When the API server received the request."""
    answered: datetime
    """When it sent the complete response."""


def writes(log: Path) -> list[Write]:
    """Every write in ``log``, in the order the API server received them."""
    found = []
    for line in log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        found.append(
            Write(
                user=event["user"]["username"],
                user_agent=event.get("userAgent", ""),
                verb=event["verb"],
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource", ""),
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                code=(event.get("responseStatus") or {}).get("code", 0),
                received=datetime.fromisoformat(event["requestReceivedTimestamp"]),
                answered=datetime.fromisoformat(event["stageTimestamp"]),
            )
        )
    return sorted(found, key=lambda w: w.received)
