"""What a daemon pod says about its local ranks: the JSON of ``GET /status`` and its metrics.

This is a wire contract between the daemon pod and the operator, so it is one set of pydantic
models that both sides import. It must stay importable without torch: the operator image has
none (tests/unit/structure/test_package_boundaries.py checks).
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from .prometheus import Metrics
from .seeding import SeedReport, SeedSource

REPORT_VERSION = 1


class _Report(BaseModel):
    # Unknown fields are ignored, not refused: a newer daemon may add some, and an older
    # operator must still read the rest during a rolling upgrade.
    model_config = ConfigDict(extra="ignore", frozen=True)


class CheckpointWatch(_Report):
    """What the rank's checkpoint on disk is now, against the bytes the arena was built from.

    ``unchanged``: every shard has the stat identity and content the arena was built from (or the
    same content under a new stat identity, already adopted). ``verifying``: a shard's stat identity
    changed and the daemon is re-hashing it to learn whether its bytes did. ``changed``: the bytes of
    ``changed_files`` differ (or the files are gone); the arena still serves the old bytes, which an
    engine that reads the checkpoint now would not get."""

    state: Literal["unchanged", "verifying", "changed"] = "unchanged"
    changed_files: list[str] = []
    """Shard (or config) file names, relative to the checkpoint directory."""
    detail: str | None = None
    """One line for people: what changed and what to do."""
    verify_bytes: int | None = Field(default=None, ge=0)
    """While ``verifying`` re-reads files: the bytes it reads in all (null while the files are still
    changing, or in the other states). With the two below, what an engine started meanwhile tells
    its user about how long the verdict takes (client/weights.py)."""
    verified_bytes: int | None = Field(default=None, ge=0)
    """Of ``verify_bytes``, those read so far."""
    verify_seconds: float | None = Field(default=None, ge=0)
    """How long the re-read had been going when ``verified_bytes`` was counted."""


class RankReport(_Report):
    """One local rank. Everything but ``rank``, ``ready`` and ``problem`` is known only once the
    rank answers on its socket (after its load); until then those fields are null."""

    rank: int = Field(ge=0)
    ready: bool
    problem: str | None = None
    """Why the rank is not ready (still loading, exited, socket not answering); null when ready."""
    pid: int | None = None
    backend: str | None = None
    bytes: int | None = Field(default=None, ge=0)
    """Bytes of the arena the rank holds (the allocation's size: what it costs in memory)."""
    tensor_count: int | None = Field(default=None, ge=0)
    gpu_uuid: str | None = None
    """The GPU holding the arena; null on cpu-shm."""
    load_seconds: float | None = Field(default=None, ge=0)
    source: SeedSource | None = None
    """disk: loaded from the checkpoint this life; keeper: re-adopted, no weight byte read; peer:
    copied from another node's daemon (``seed`` says which), no weight byte read."""
    seed: SeedReport | None = None
    """Null unless the rank asked peers for its bytes (seeding on and a peer held them)."""
    fingerprint: str | None = None
    disk_bytes_read: int | None = Field(default=None, ge=0)
    """Checkpoint bytes the rank's loader actually read (0 after a keeper re-adoption)."""
    maps_served: int | None = Field(default=None, ge=0)
    """Fetches answered: each is an engine rank mapping the arena."""
    connections_total: int | None = Field(default=None, ge=0)
    deposited: bool | None = None
    """Whether the node's keeper holds the arena now (it survives a daemon crash)."""
    uptime_seconds: float | None = Field(default=None, ge=0)
    checkpoint: CheckpointWatch | None = None
    """Null from a daemon that does not watch its checkpoint, or a rank that has not answered."""


HOST_DEVICE = "host"
"""``DeviceMemory.device`` of the host's RAM (where cpu-shm arenas live); GPUs go by UUID."""


class DeviceMemory(_Report):
    """Memory of one device the node's arenas can live on, when the report was taken
    (device_memory.py says where the numbers come from)."""

    device: str
    """``host`` or a GPU UUID (``GPU-…``)."""
    total_bytes: int | None = Field(default=None, ge=0)
    free_bytes: int | None = Field(default=None, ge=0)
    """What a second generation's arena could still get; null when ``error`` says why not."""
    error: str | None = None


class ArtifactReport(_Report):
    """The node's compile-artifact directory (``weightcache.artifacts``), counted since the daemon
    pod started: engines that started from a published entry (``hits``), engines that compiled
    anew (``misses``), and what the daemon did with their staging directories."""

    hits: int = Field(default=0, ge=0)
    misses: int = Field(default=0, ge=0)
    published: int = Field(default=0, ge=0)
    lost_races: int = Field(default=0, ge=0)
    """Misses published by another engine of the same key first (one entry per key)."""
    refused: int = Field(default=0, ge=0)
    """Staging directories not published (a symlink, a special file, over the size bound, a bad claim)."""
    evicted: int = Field(default=0, ge=0)
    entries: int = Field(default=0, ge=0)
    bytes: int = Field(default=0, ge=0)
    max_bytes: int = Field(default=0, ge=0)
    problem: str | None = None
    """The last refusal or failure, for people."""


class DaemonReport(_Report):
    """A daemon pod's ranks. ``fingerprint`` identifies what the whole node holds (see
    ``node_fingerprint``); null until every rank answers. ``memory``: the host's and each GPU's
    free memory, for deciding whether a second daemon generation fits next to this one."""

    version: int = REPORT_VERSION
    cache: str
    ready: bool
    fingerprint: str | None = None
    ranks: list[RankReport]
    memory: list[DeviceMemory] = []
    artifacts: ArtifactReport | None = None
    """Null when the daemon keeps no compile artifacts (``--artifact-dir`` unset)."""


def node_fingerprint(ranks: list[RankReport]) -> str | None:
    """One digest over the ranks' weight digests (``Fingerprint.weights_digest``; each differs: it
    includes the rank). Nodes that hold the same weights for the same ranks, each from its own copy
    of the checkpoint, get the same value, so mixed generations behind one Service show up as
    differing node fingerprints."""
    if not ranks or any(r.fingerprint is None for r in ranks):
        return None
    text = "".join(f"{r.rank}:{r.fingerprint}\n" for r in sorted(ranks, key=lambda r: r.rank))
    return hashlib.sha256(text.encode()).hexdigest()


VOLATILE_RANK_FIELDS = frozenset({"uptime_seconds", "connections_total", "maps_served"})
"""Counters that move with every request or second: no news for whoever waits on a report."""
VOLATILE_CHECKPOINT_FIELDS = frozenset({"verify_bytes", "verified_bytes", "verify_seconds"})
"""A re-read's progress: the verdict (``state``, ``changed_files``, ``detail``) is the news."""


def report_digest(report: DaemonReport) -> str:
    """What ``GET /status``'s ``ETag`` carries and ``?after=`` compares: a digest of the report
    without its memory, artifact counts, counters and re-read progress, so it changes when what
    the report says about the ranks (readiness, problems, fingerprints, the checkpoint watch's
    verdict) does, not with every request. Both sides compute it from the report alone: the
    operator knows the digest of a report it read without having kept any header."""
    ranks = [
        {
            **rank.model_dump(exclude=set(VOLATILE_RANK_FIELDS | {"checkpoint"})),
            "checkpoint": None
            if rank.checkpoint is None
            else rank.checkpoint.model_dump(exclude=set(VOLATILE_CHECKPOINT_FIELDS)),
        }
        for rank in report.ranks
    ]
    said = {**report.model_dump(include={"version", "cache", "ready", "fingerprint"}), "ranks": ranks}
    return hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()[:32]


def report_metrics(report: DaemonReport) -> Metrics:
    """The report as Prometheus series, labelled by cache, rank and gpu (empty on cpu-shm)."""
    m = Metrics()
    m.describe("weightcache_daemon_rank_ready", "gauge", "1 while the rank holds its weights and answers on its socket")
    m.describe("weightcache_daemon_bytes_held", "gauge", "bytes of the rank's arena")
    m.describe("weightcache_daemon_load_seconds", "gauge", "seconds the rank took to load (or re-adopt) its weights")
    m.describe(
        "weightcache_daemon_adopted", "gauge", "1 if the rank re-adopted its arena from the keeper (no disk read)"
    )
    m.describe("weightcache_daemon_disk_read_bytes_total", "counter", "checkpoint bytes the rank's loader read")
    m.describe("weightcache_daemon_maps_served_total", "counter", "arena fetches answered (engine ranks mapping it)")
    m.describe("weightcache_daemon_connections_total", "counter", "socket connections accepted by the rank")
    m.describe(
        "weightcache_daemon_device_free_bytes", "gauge", "free memory of a device arenas live on (host RAM or GPU)"
    )
    m.describe("weightcache_daemon_device_total_bytes", "gauge", "total memory of a device arenas live on")
    m.describe(
        "weightcache_daemon_checkpoint_changed",
        "gauge",
        "1 while the checkpoint on disk holds other bytes than the rank's arena (restart the daemon to load them)",
    )
    m.describe("weightcache_daemon_seed_bytes_total", "counter", "bytes the rank copied from a peer daemon (verified)")
    m.describe(
        "weightcache_daemon_seed_fallbacks_total",
        "counter",
        "1 when the rank asked peers for its bytes and loaded from the disk after all (the report's seed.fallback says why)",
    )
    m.describe("weightcache_artifacts_hits_total", "counter", "engines started from published compile artifacts")
    m.describe("weightcache_artifacts_misses_total", "counter", "engines that found no compile artifacts for their key")
    m.describe("weightcache_artifacts_bytes", "gauge", "bytes of the published compile-artifact entries")
    if report.artifacts is not None:
        m.set("weightcache_artifacts_hits_total", report.artifacts.hits, cache=report.cache)
        m.set("weightcache_artifacts_misses_total", report.artifacts.misses, cache=report.cache)
        m.set("weightcache_artifacts_bytes", report.artifacts.bytes, cache=report.cache)
    for memory in report.memory:
        if memory.free_bytes is not None:
            m.set("weightcache_daemon_device_free_bytes", memory.free_bytes, cache=report.cache, device=memory.device)
        if memory.total_bytes is not None:
            m.set("weightcache_daemon_device_total_bytes", memory.total_bytes, cache=report.cache, device=memory.device)
    for rank in report.ranks:
        labels = {"cache": report.cache, "rank": rank.rank, "gpu": rank.gpu_uuid or ""}
        m.set("weightcache_daemon_rank_ready", 1.0 if rank.ready else 0.0, **labels)
        if rank.bytes is not None:
            m.set("weightcache_daemon_bytes_held", rank.bytes, **labels)
        if rank.load_seconds is not None:
            m.set("weightcache_daemon_load_seconds", rank.load_seconds, **labels)
        if rank.source is not None:
            m.set("weightcache_daemon_adopted", 1.0 if rank.source == "keeper" else 0.0, **labels)
        if rank.seed is not None:
            m.set("weightcache_daemon_seed_bytes_total", rank.seed.bytes, **labels)
            m.set("weightcache_daemon_seed_fallbacks_total", 1.0 if rank.seed.fallback else 0.0, **labels)
        if rank.disk_bytes_read is not None:
            m.set("weightcache_daemon_disk_read_bytes_total", rank.disk_bytes_read, **labels)
        if rank.maps_served is not None:
            m.set("weightcache_daemon_maps_served_total", rank.maps_served, **labels)
        if rank.connections_total is not None:
            m.set("weightcache_daemon_connections_total", rank.connections_total, **labels)
        if rank.checkpoint is not None:
            m.set("weightcache_daemon_checkpoint_changed", 1.0 if rank.checkpoint.state == "changed" else 0.0, **labels)
    return m
