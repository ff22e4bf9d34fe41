"""``spec.engine``: the engine pods, their template, rollout, failover and GPU access, and the
stop timings the renderers share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from weightcache_operator.spec.base import DNS_SUBDOMAIN, ApiModel, FreeForm, cel, default_object, validations
from weightcache_operator.spec.sglang import Sglang
from weightcache_operator.spec.vllm import Vllm

GpuAccess = Literal["visibleDevices", "dra"]
WeightFallback = Literal["disk", "error"]


class EnginePodSpec(BaseModel):
    """A core/v1 PodSpec; only ``containers`` is checked here, the rest passes through."""

    model_config = ConfigDict(extra="allow")

    containers: list[FreeForm] = Field(min_length=1)


class EngineTemplate(ApiModel):
    """A pod template for engines, like a Deployment's; the operator adds the socket mount,
    client environment, GPU access, labels and the daemon-ready readiness gate."""

    metadata: FreeForm | None = None
    spec: EnginePodSpec


class EngineRollout(ApiModel):
    """How a change to the engine template rolls through the replicas (``maxSurge`` at a time)."""

    ready_deadline_seconds: int = Field(
        default=600,
        ge=1,
        le=86400,
        description="A new-version engine not Ready this long after its creation stops the rollout;"
        " the old version keeps serving.",
    )
    max_surge: int = Field(
        default=1,
        ge=1,
        le=100,
        description="How many replicas an engine template change rolls at once: each gets one extra"
        " new-version engine (a whole group with parallelism.nodes > 1) next to its old ones, is"
        " promoted and drained, and the next replica starts as soon as one is whole again, so N"
        " replicas take about ceil(N / maxSurge) engine starts. Each costs an engine's resources"
        " while it starts. Every replica keeps its Ready active throughout. While the rollout is"
        " stalled, no further replica starts; those already under way finish. A daemon generation"
        " change starts every replica's new engine at once and does not use it. Values above"
        " replicas act as replicas.",
    )


UNRESPONSIVE_FLOOR = cel("self == 0 || self >= 100", "unresponsiveAfterMilliseconds must be 0 (off) or at least 100")


class EngineFailover(ApiModel):
    """How engines ride out trouble that is not their own."""

    daemon_outage_grace_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a Ready engine that has already mapped its weights keeps its"
        " daemon-ready gate (and so its place behind the Service) while its node's daemon pod is"
        " NotReady: the same pod, of the engine's generation, not being deleted, on a Ready node."
        " The mapping stays valid while the daemon restarts and re-adopts its arena from the"
        " keeper. 0: the gate follows the daemon's readiness at once.",
    )
    unresponsive_after_milliseconds: int = Field(
        default=0,
        ge=0,
        le=60000,
        json_schema_extra=validations(UNRESPONSIVE_FLOOR),
        description="Sub-second hang detection. When set, the operator itself GETs every Ready"
        " engine's readiness endpoint (its readinessProbe's httpGet) every 100 ms; an active that"
        " answers nothing for this long, while a standby of the same cache answers, hands the"
        " Service to a Ready, answering standby and becomes a standby itself. It is demoted, not"
        " deleted: a slow engine finishes its requests and serves again as a standby, so a wrong"
        " verdict costs one role swap; a hung one is then left to its kubelet probes. 0 (the"
        " default): hangs are detected by the kubelet's readiness probe alone (1 s period at best)."
        " Set it above the slowest answer a healthy, loaded engine gives (at least 100).",
    )

    keep_warm_seconds: int = Field(
        default=30,
        ge=0,
        le=86400,
        description="Every serving engine pod runs a warm sidecar: the pod is Ready only once the engine"
        " has answered a real request through its own API (one generated token) since it last came up,"
        " so a standby that counts as ready to take over has served, and answers the first client"
        " request after a failover as fast as a serving active. Every this many seconds after that it"
        " sends the request again, so an idle standby stays hot: one token per interval per engine."
        " 0: warm once per engine start, never again. Applies to engine pods created after a change.",
    )

    @model_validator(mode="after")
    def _unresponsive_floor(self) -> EngineFailover:
        if 0 < self.unresponsive_after_milliseconds < 100:
            raise ValueError(
                f"{UNRESPONSIVE_FLOOR['message']}, not {self.unresponsive_after_milliseconds}: a"
                " healthy engine's answer alone can take that long"
            )
        return self


class Dra(ApiModel):
    """How the daemon's GPUs are claimed with ``gpuAccess: dra`` (resource.k8s.io/v1). Each daemon
    pod gets a ResourceClaim from a template; the node's engines reference that very claim, so
    they are given the devices that hold the weights."""

    device_class_name: str = Field(
        default="gpu.nvidia.com",
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="The DeviceClass the daemon's claim requests (ranks per node devices of it).",
    )


PRE_STOP_SLEEP_DEFAULT_S = 5
"""Endpoint removal reaches kube-proxy on every node within about a second in a healthy cluster;
load balancers that follow EndpointSlices take a few more."""
ENGINE_DRAIN_S = 30
"""How long an engine told to stop may spend finishing its in-flight requests: the reference
engine's --drain-timeout default, and vLLM's --shutdown-timeout as the operator renders it."""
STOP_GRACE_S = ENGINE_DRAIN_S + 10
"""An engine pod's grace period after its preStop sleep: the drain, then time to exit."""


class Engine(ApiModel):
    """Engine pods: per replica one active engine behind the Service and hot standbys that map
    the same weights (KV-cache memory, not a second copy of the model)."""

    replicas: int = Field(default=1, ge=0, le=1000)
    standbys_per_replica: int = Field(default=0, ge=0, le=100)
    template: EngineTemplate
    port: int = Field(default=8000, ge=1, le=65535, description="The engine's serving port.")
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        pattern=r"^\S+$",
        description="The model's name in the engines' OpenAI API (/v1/models, the model field of requests and"
        " answers): what clients ask for. Defaults to the WeightCache's name; status.servedModelName shows it."
        " Changing it rolls the engines, not the daemons.",
    )
    gpu_access: GpuAccess = Field(
        default="visibleDevices",
        description="visibleDevices: engines request no GPUs and get the daemon's GPU UUIDs; "
        "dra: a ResourceClaim shared with the daemon.",
    )
    dra: Dra | None = Field(default=None, description="Used with gpuAccess dra; its defaults apply when unset.")
    weight_fallback: WeightFallback = Field(
        default="disk", description="When cached weights cannot be used: load from disk (saying why) or fail."
    )
    vllm: Vllm | None = Field(
        default=None,
        description="Set: the engines run vLLM (vllm serve, its first container's command rendered by the"
        " operator) and the daemons hold vLLM's own layout, built by vLLM's loader; one list of vLLM arguments,"
        " derived from the spec and followed by args, goes to both. Unset: the reference engine (or another"
        " engine using the weightcache client) over the daemons' own layout.",
    )
    sglang: Sglang | None = Field(
        default=None,
        description="Set: the engines run SGLang (python -m sglang.launch_server, its first container's command"
        " rendered by the operator) and the daemons hold SGLang's own layout, built by SGLang's loader; one list"
        " of SGLang arguments, derived from the spec and followed by args, goes to both (docs/sglang.md).",
    )
    pre_stop_sleep_seconds: int = Field(
        default=PRE_STOP_SLEEP_DEFAULT_S,
        ge=0,
        le=300,
        description="How long a deleted engine pod keeps serving before it is told to stop: a preStop sleep on"
        " its engine container (the first), the time every node's Service proxy and any load balancer need to"
        " stop sending it new requests once the pod is deleted (rollouts, scale-down, kubectl drain, failover"
        " of a deleted active). Then SIGTERM, on which the engine finishes its in-flight requests. Unless the"
        " template sets terminationGracePeriodSeconds (which must then exceed this), the grace period is this"
        f" plus {STOP_GRACE_S} s. A preStop hook of the template's own wins. 0: the engine is told to stop at once.",
    )
    rollout: EngineRollout = Field(default_factory=EngineRollout, json_schema_extra=default_object(EngineRollout))
    failover: EngineFailover = Field(default_factory=EngineFailover, json_schema_extra=default_object(EngineFailover))
