"""The checkpoint under running daemons: the ``CheckpointChanged`` condition and, with
``spec.model.onChange: Reload``, the change that starts a new daemon generation. Pure: the daemon
reports of the current generation in, the condition and ``status.checkpointReload`` out.

Each rank of a daemon reports what its checkpoint on disk is now against the bytes its arena was
built from (``RankReport.checkpoint``: unchanged, verifying, changed). A changed checkpoint is
never served silently: the arena keeps the bytes it loaded, and an engine that fell back to disk
would read others. So:

- ``changed`` on some node: ``CheckpointChanged=True`` naming the nodes and files and what to do,
  and a Warning Event (reasons.failure_events) each time that message changes;
- ``Report`` (the default): that is all; the daemons keep serving the bytes they loaded;
- ``Reload``: the change's identity (nodes, files, the daemons' weight fingerprints) is recorded
  in ``status.checkpointReload``, which ``layout.daemon_spec_hash`` folds in: the generation
  changes, and engines move to daemons that load the new bytes through the ordinary generation
  change (blue/green or node by node). Only the current generation's reports count, so once the
  record names a new generation the old daemons' reports (still ``changed``) start nothing more:
  one new generation per change, not one per pass. A later change, seen by the new generation's
  daemons, has another identity and reloads again;
- ``verifying``: the daemon is still re-hashing a file whose stat identity changed (equal bytes
  under a new inode keep the arena); nothing happens until it says ``changed`` or ``unchanged``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from weightcache_contract.daemon_report import DaemonReport

from weightcache_operator.objects import stamp

CONDITION = "CheckpointChanged"
MAX_FILES = 20
"""Files named in the condition and the record; the rest are counted."""


@dataclass(frozen=True)
class Observation:
    """What the current generation's daemons say about their checkpoint."""

    changed: dict[str, list[str]] = field(default_factory=dict)
    """Node → changed files (sorted), for nodes where some rank says ``changed``."""
    verifying: list[str] = field(default_factory=list)
    """Nodes where some rank is re-hashing and none says ``changed``."""
    fingerprints: dict[str, str] = field(default_factory=dict)
    """Node → what its daemon holds (the node fingerprint, else its ranks'), for changed nodes."""
    details: list[str] = field(default_factory=list)
    """The daemons' own one-line details, first per node."""

    @property
    def identity(self) -> str | None:
        """A digest of this change: equal for the same files changed under the same arenas."""
        if not self.changed:
            return None
        seen = {node: [files, self.fingerprints.get(node, "")] for node, files in self.changed.items()}
        return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()[:16]


def observe(reports: Mapping[str, DaemonReport | str | None]) -> Observation:
    """The checkpoint watch over ``reports`` (node → its current-generation daemon's report)."""
    changed: dict[str, list[str]] = {}
    verifying: list[str] = []
    fingerprints: dict[str, str] = {}
    details: list[str] = []
    for node, report in sorted(reports.items()):
        if not isinstance(report, DaemonReport):
            continue
        watches = [r.checkpoint for r in report.ranks if r.checkpoint is not None]
        if any(w.state == "changed" for w in watches):
            changed[node] = sorted({f for w in watches if w.state == "changed" for f in w.changed_files})
            ranks = "".join(sorted(f"{r.rank}:{r.fingerprint}" for r in report.ranks if r.fingerprint))
            fingerprints[node] = report.fingerprint or ranks
            said = next((w.detail for w in watches if w.state == "changed" and w.detail), None)
        elif any(w.state == "verifying" for w in watches):
            verifying.append(node)
            said = next((w.detail for w in watches if w.state == "verifying" and w.detail), None)
        else:
            continue
        if said:
            details.append(f"{node}: {said}")
    return Observation(changed, verifying, fingerprints, details)


def _files(files: list[str]) -> str:
    shown = ", ".join(files[:MAX_FILES])
    more = len(files) - MAX_FILES
    return (shown or "files the daemon did not name") + (f" and {more} more" if more > 0 else "")


def _where(changed: dict[str, list[str]]) -> str:
    """``node-1, node-2: a.safetensors; node-3: b.safetensors``: nodes with the same files together."""
    by_files: dict[str, list[str]] = {}
    for node, files in sorted(changed.items()):
        by_files.setdefault(_files(files), []).append(node)
    return "; ".join(f"{', '.join(nodes)}: {files}" for files, nodes in by_files.items())


def condition_fields(seen: Observation, on_change: str, record: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """(status, reason, message) of ``CheckpointChanged``."""
    if seen.changed:
        head = f"the checkpoint changed under the running daemons: {_where(seen.changed)}"
        if on_change == "Reload":
            return (
                "True",
                "Reloading",
                f"{head}; spec.model.onChange is Reload: a new daemon generation loads the new bytes and the "
                "engines move to it as for a spec change",
            )
        return (
            "True",
            "FilesChanged",
            f"{head}; the daemons keep serving the bytes they loaded, which an engine reading the checkpoint now "
            "would not get. To serve the new bytes set spec.model.onChange: Reload (or change spec.model.revision); "
            "to keep the old ones, restore the files",
        )
    if seen.verifying:
        said = f" ({'; '.join(seen.details)})" if seen.details else ""
        return (
            "False",
            "Verifying",
            f"{', '.join(seen.verifying)}: a checkpoint file's identity changed; its bytes are being re-hashed{said}",
        )
    if record is not None:
        return (
            "False",
            "Reloaded",
            f"this daemon generation was started for the checkpoint change seen at {record.get('seenAt')} on "
            f"{', '.join(record.get('nodes') or [])} (spec.model.onChange: Reload); none of its daemons reports a "
            "change since",
        )
    return "False", "Unchanged", "no daemon of this generation reports a changed checkpoint"


def reload_record(
    seen: Observation, on_change: str, record: Mapping[str, Any] | None, now: datetime
) -> dict[str, Any] | None:
    """``status.checkpointReload``: a new record when ``Reload`` meets a change not recorded yet
    (which changes the generation: layout.daemon_spec_hash), else the recorded one, kept."""
    identity = seen.identity
    if on_change != "Reload" or identity is None or (record or {}).get("identity") == identity:
        return dict(record) if record is not None else None
    files = sorted({f for fs in seen.changed.values() for f in fs})
    return {
        "identity": identity,
        "nodes": sorted(seen.changed),
        "files": files[:MAX_FILES],
        "seenAt": stamp(now),
    }
