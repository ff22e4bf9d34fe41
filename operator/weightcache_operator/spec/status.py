"""``status``: what the operator reports, written only through the status subresource."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, PlainSerializer
from weightcache_contract.seeding import SeedSource

from weightcache_operator.spec.base import ApiModel, stamp
from weightcache_operator.spec.routing import InferencePoolMode

Phase = Literal["Pending", "Loading", "Ready", "Degraded", "Failed"]
ConditionStatus = Literal["True", "False", "Unknown"]
FailoverSignal = Literal[
    "PodDeleted",
    "PodGone",
    "PodEvicted",
    "PodFailed",
    "NodeNotReady",
    "ContainerRestarted",
    "DaemonNotReady",
    "ReadinessFailed",
    "Unresponsive",
    "NodeCordoned",
    "DisruptionTarget",
]


def _milliseconds(when: datetime) -> str:
    return stamp(when, "milliseconds")


def _microseconds(when: datetime) -> str:
    return stamp(when, "microseconds")


# Each time field keeps, on the wire, the precision of what it times: what the API server's own
# timestamps say (whole seconds) or the operator's clock where that is finer than a second.
Timestamp = Annotated[datetime, PlainSerializer(stamp, return_type=str, when_used="json")]
MillisecondTimestamp = Annotated[datetime, PlainSerializer(_milliseconds, return_type=str, when_used="json")]
MicrosecondTimestamp = Annotated[datetime, PlainSerializer(_microseconds, return_type=str, when_used="json")]


class Condition(ApiModel):
    """The Kubernetes condition convention (metav1.Condition): DaemonsReady, EnginesReady,
    Available, Progressing, Degraded, GenerationChange, CheckpointChanged, InferencePoolReady."""

    type: str = Field(min_length=1, max_length=316)
    status: ConditionStatus
    reason: str | None = Field(default=None, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str | None = Field(default=None, max_length=32768)
    last_transition_time: Timestamp | None = None
    observed_generation: int | None = Field(default=None, ge=0)


class RankStatus(ApiModel):
    """One local rank of a node's daemon, as the daemon pod's status endpoint reports it."""

    rank: int = Field(ge=0)
    ready: bool = False
    bytes: int | None = Field(default=None, ge=0, description="Bytes of the rank's arena.")
    load_seconds: float | None = Field(default=None, ge=0)
    gpu_uuid: str | None = Field(default=None, description="The GPU holding the rank's weights; unset on cpu-shm.")
    source: SeedSource | None = Field(
        default=None,
        description="disk: loaded from the checkpoint; keeper: re-adopted without reading it; peer: copied from"
        " another node's daemon (seedPeer).",
    )
    disk_bytes_read: int | None = Field(
        default=None, ge=0, description="Checkpoint bytes the rank's loader read (0 after a keeper re-adoption)."
    )
    seed_peer: str | None = Field(
        default=None,
        description="The node whose daemon the rank's bytes were copied from; unset when they came from the disk.",
    )
    seed_bytes: int | None = Field(
        default=None, ge=0, description="Bytes copied from a peer (verified); set when the rank asked peers."
    )
    seed_seconds: float | None = Field(
        default=None, ge=0, description="How long asking peers took, the fallback's attempts included."
    )


class ArtifactStatus(ApiModel):
    """The node's compile-artifact directory (``spec.engine.vllm.artifactCache``), as its daemon
    pod counted since it started."""

    hits: int = Field(default=0, ge=0, description="Engines that started from a published entry.")
    misses: int = Field(default=0, ge=0, description="Engines that compiled anew (no entry for their key).")
    published: int = Field(default=0, ge=0, description="Entries the daemon published from engines that compiled.")
    entries: int = Field(default=0, ge=0, description="Published entries now.")
    bytes: int = Field(default=0, ge=0, description="Bytes of the published entries now.")
    problem: str | None = Field(default=None, max_length=1024, description="The last staging directory refused.")


class NodeStatus(ApiModel):
    """One node's daemon pod and its local ranks."""

    node: str
    ranks: list[RankStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["rank"]},
    )
    daemon_pod: str | None = None
    fingerprint: str | None = Field(
        default=None, description="Digest of the ranks' weight fingerprints: equal on nodes holding the same weights."
    )
    artifacts: ArtifactStatus | None = Field(
        default=None, description="Compile artifacts on the node; unset without spec.engine.vllm.artifactCache."
    )
    report_error: str | None = Field(
        default=None,
        description="Why the daemon pod's status endpoint could not be read (then ranks show pod readiness only).",
    )


class PlanStatus(ApiModel):
    """The plan the daemon pods' ``plan`` init container checked before any rank started: a summary,
    not a row per rank (``weightcache plan`` on the checkpoint prints those)."""

    ranks: int = Field(ge=0, description="Ranks in the world (tensor x pipeline).")
    max_rank_bytes: int = Field(ge=0, description="The largest rank's arena.")
    total_bytes: int = Field(ge=0, description="Every rank's arena together: one copy of the model.")
    node: str | None = Field(default=None, description="The node whose plan this is.")
    node_bytes: int | None = Field(default=None, ge=0, description="That node's ranks' arenas together.")
    limit_bytes: int | None = Field(
        default=None, ge=0, description="What that node's ranks were checked against; unset when none was known."
    )
    limit: str | None = Field(default=None, max_length=1024, description="What limitBytes is, or why there is none.")


class CheckpointReloadStatus(ApiModel):
    """The checkpoint change that the current daemon generation was started for (spec.model.onChange:
    Reload). Its identity is part of the generation: a new one starts a new generation."""

    identity: str = Field(min_length=1, max_length=64, description="A digest of the nodes, files and fingerprints.")
    nodes: list[str] = Field(default_factory=list, description="The nodes whose daemons reported the change.")
    files: list[str] = Field(default_factory=list, description="The changed files (the first 20).")
    seen_at: Timestamp | None = Field(default=None, description="When the operator saw the change.")


class EngineStatus(ApiModel):
    """One replica: the engine pod behind the Service and its standbys."""

    replica: int = Field(ge=0)
    active: str | None = None
    standbys: list[str] = Field(default_factory=list)


class RolloutReplicaStatus(ApiModel):
    """One replica of a rollout: its new engine's start against the promotion and the old engines'
    drain (operator/weightcache_operator/rollout_timing.py)."""

    replica: int = Field(ge=0)
    engine: str = Field(description="The new engine pod (a group's leader) promoted to active.")
    start_seconds: float | None = Field(
        default=None, ge=0, description="The new engine's creation to Ready, from its pod's timestamps (whole seconds)."
    )
    promoted_at: MillisecondTimestamp | None = Field(
        default=None, description="When the pass that promoted it began, on the operator's clock (milliseconds)."
    )
    promotion_seconds: float | None = Field(default=None, ge=0, description="From its Ready to promotedAt.")
    retired_at: MillisecondTimestamp | None = Field(
        default=None, description="When the pass that first deleted one of the replica's old engines began."
    )
    drain_seconds: float | None = Field(
        default=None, ge=0, description="From retiredAt until none of the replica's old engines was left."
    )


class RolloutStatus(ApiModel):
    """The last (or current) change rolled onto running engines (operator/weightcache_operator/rollout/)."""

    phase: Literal["Progressing", "Stalled", "Complete"]
    mode: Literal["Engine", "Generation"] | None = Field(
        default=None, description="Engine: the engine template changed; Generation: what the daemons hold changed."
    )
    engine_template_hash: str | None = Field(default=None, description="The engine template hash being rolled out.")
    daemon_spec_hash: str | None = Field(default=None, description="The daemon spec hash being rolled out.")
    updated: int = Field(default=0, ge=0, description="Replicas whose engines all run the new version.")
    total: int = Field(default=0, ge=0)
    current_step: str | None = None
    message: str | None = Field(default=None, description="Why the rollout stalled.")
    started_at: Timestamp | None = None
    finished_at: Timestamp | None = None
    replicas: list[RolloutReplicaStatus] = Field(
        default_factory=list,
        description="Each replica whose new engine was promoted: start, promotion and drain times.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["replica"]},
    )


class EngineStartStatus(ApiModel):
    """An engine pod's start as its pod object tells it (operator/weightcache_operator/engine_start.py):
    every duration is seconds since the pod's creation, from the API server's timestamps (whole
    seconds). The engine's own log and metrics split the time after its process started."""

    pod: str
    replica: int | None = Field(default=None, ge=0)
    node: str | None = None
    created_at: Timestamp | None = None
    ready_at: Timestamp | None = None
    scheduled_seconds: float | None = Field(default=None, ge=0, description="Bound to a node.")
    started_seconds: float | None = Field(default=None, ge=0, description="Every container running.")
    ready_seconds: float = Field(ge=0, description="Ready: the whole start.")
    restarts: int = Field(default=0, ge=0, description="Container restarts before Ready.")
    slow: bool = Field(
        default=False,
        description="readySeconds reached half of engine.rollout.readyDeadlineSeconds (a SlowEngineStart Event).",
    )


class FailoverStatus(ApiModel):
    """The latest failover: which engine failed, how the operator learned it, which standby took
    over and how fast. Every duration is measured on the operator's own clock, to the
    microsecond: never from the API server's timestamps, which have one-second resolution."""

    time: MicrosecondTimestamp = Field(
        description="When the operator's pass that promoted the standby began (after reading the cluster), "
        "on the operator's clock, to the microsecond."
    )
    replica: int = Field(ge=0)
    from_: str | None = Field(default=None, alias="from", description="The failed active engine pod.")
    from_node: str | None = None
    to: str = Field(description="The standby promoted to active.")
    to_node: str | None = None
    signal: FailoverSignal | None = None
    reason: str | None = Field(default=None, max_length=1024)
    detection_ms: float | None = Field(
        default=None,
        ge=0,
        description="From the operator's first sight of the failure to `time`, on the operator's clock. First sight: "
        "the arrival of the first watch event showing the failed pod (any pod of a failed engine group) failing; for "
        "NodeNotReady, of its node's event showing it not Ready; for Unresponsive, the send of the first probe the "
        "engine left unanswered (so it includes unresponsiveAfterMilliseconds); otherwise the start of the first pass "
        "that saw it. It includes any wait for a Ready standby. It does not include the time from the failure itself "
        "to the API server's event (the kubelet noticing it, the watch delivering it), which the operator cannot time: "
        "after an operator restart first sight is the restart, see failureApiSecond. Absent when the failed pod was "
        "never seen failing (PodGone).",
    )
    promotion_ms: float = Field(
        ge=0, description="From `time` to the promoted standby's relabel patched, on the operator's clock."
    )
    failure_api_second: Timestamp | None = Field(
        default=None,
        description="The failure's timestamp as the API server recorded it (deletionTimestamp less its grace period, "
        "the containers' finishedAt, the condition's lastTransitionTime), which the API keeps to the whole second, "
        "truncated: it says how old a failure already was when the operator first saw it (one that came while no "
        "operator watched), never how fast it was detected. Absent when the API has none (Unresponsive, PodGone).",
    )

    def whole(self) -> FailoverStatus:
        """This failover with every field set. The status is merge-patched: what this failover
        lacks (a PodGone has no ``from``) is written as null, or the previous failover's values
        would survive next to it."""
        return FailoverStatus.model_construct(set(FailoverStatus.model_fields), **dict(self))


class InferencePoolStatus(ApiModel):
    """The InferencePool of spec.routing; the InferencePoolReady condition says whether it selects
    exactly the serving engines."""

    name: str
    mode: InferencePoolMode


class WeightCacheStatus(ApiModel):
    """Written only by the operator, through the status subresource.

    ``readyNodes``, ``activeEngines``, ``standbyEngines``, ``generationChange`` and ``model`` are
    summaries for the printer columns, which can only show a field, not count or choose between fields."""

    # Frozen: a pass adds to the status only through copies (``merged``, ``with_conditions``,
    # plan/status_reports.py), so the status one step hands on is the one the next step reads.
    model_config = ConfigDict(frozen=True)

    observed_generation: int | None = Field(default=None, ge=0)
    phase: Phase | None = None
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    nodes: list[NodeStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["node"]},
    )
    engines: list[EngineStatus] = Field(
        default_factory=list,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["replica"]},
    )
    daemon_spec_hash: str | None = None
    plan: PlanStatus | None = Field(
        default=None, description="The checked plan of the current generation, once a daemon pod's plan passed."
    )
    checkpoint_reload: CheckpointReloadStatus | None = None
    rollout: RolloutStatus | None = None
    generation_change: str | None = Field(
        default=None,
        description="How the daemon generation change under way goes (the GenerationChange condition's reason: "
        "BlueGreen or NodeByNode); unset when none is. The phase stays Ready through a change while engines serve.",
    )
    ready_nodes: str | None = Field(default=None, description='Nodes whose daemons are ready, as "ready/desired".')
    active_engines: int | None = Field(default=None, ge=0)
    standby_engines: int | None = Field(default=None, ge=0)
    model: str | None = Field(default=None, description="The model source and revision, in one line.")
    served_model_name: str | None = Field(
        default=None,
        description="The name the engines serve the model under (spec.engine.servedModelName or the"
        " WeightCache's name): the model field clients send.",
    )
    message: str | None = Field(
        default=None,
        description="What is wrong, in one line (the Degraded condition's message), else what the daemons of "
        "nodes that are not ready say they wait for; unset when nothing is.",
    )
    last_failover: FailoverStatus | None = None
    last_engine_start: EngineStartStatus | None = Field(
        default=None, description="The engine pod that turned Ready last, as this operator saw it start."
    )
    inference_pool: InferencePoolStatus | None = None

    def merged(self, later: WeightCacheStatus) -> WeightCacheStatus:
        """A copy with every field set in ``later`` set to its value there (lists replaced whole,
        as a merge patch replaces them): how a pass adds a part to the status it computed."""
        return self.model_copy(update={name: getattr(later, name) for name in later.model_fields_set})

    def with_conditions(self, conditions: Sequence[Condition]) -> WeightCacheStatus:
        """A copy whose conditions are this one's with ``conditions`` in: each replaces the one of
        its type, else joins at the end (the list is keyed by type)."""
        replaced = {c.type for c in conditions}
        kept = [c for c in self.conditions if c.type not in replaced]
        return self.model_copy(update={"conditions": [*kept, *conditions]})

    def wire(self) -> dict[str, Any]:
        """The status as the operator patches it: camelCase JSON of the fields that were set, a
        field set to None included (a merge patch's delete), every time at its field's precision."""
        return super().wire()
