"""The WeightCache API (``weightcache.io/v1alpha1``) as pydantic models.

These models are the single source of truth: ``crd.py`` generates the CustomResourceDefinition
from them, and the operator parses the objects it reads with them. Every rule the API server
enforces through a CEL expression (``x-kubernetes-validations``) is also checked by a model
validator here, so a spec that the operator accepts is one the API server would accept; the CEL
text and the Python check sit side by side so they change together.

Field names are snake_case in Python and camelCase on the wire (pydantic aliases).
Free-form Kubernetes objects (pod template spec, affinity, tolerations, resources) are plain
dicts: the operator passes them through to the objects it renders, and the CRD keeps their
unknown fields (``x-kubernetes-preserve-unknown-fields``) instead of pruning them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from weightcache_contract.backends import Backend

GROUP = "weightcache.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "WeightCache"
PLURAL = "weightcaches"
SINGULAR = "weightcache"
SHORT_NAMES = ("wc",)

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
QuantizationMethod = Literal["none", "fp8"]
GpuAccess = Literal["visibleDevices", "dra"]
WeightFallback = Literal["disk", "error"]
ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]
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

FreeForm = dict[str, Any]
"""A Kubernetes object the operator passes through unchanged (kept whole by the CRD)."""


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


# --- spec.model ---------------------------------------------------------------------------------


class HostPathSource(ApiModel):
    """A checkpoint directory present at the same path on every selected node."""

    path: str = Field(min_length=1, max_length=4096, pattern=r"^/", description="Absolute path on the node.")


class PvcSource(ApiModel):
    """A checkpoint on a PersistentVolumeClaim in the cache's namespace, mounted read-only."""

    claim_name: str = Field(min_length=1, max_length=253, description="PersistentVolumeClaim name.")
    sub_path: str | None = Field(
        default=None, max_length=4096, description="Directory inside the volume that holds the checkpoint."
    )


SOURCE_EXACTLY_ONE = cel("has(self.hostPath) != has(self.pvc)", "exactly one of hostPath or pvc must be set")
SOURCE_IMMUTABLE = cel(
    "self == oldSelf", "the model source is immutable; create a new WeightCache to serve another checkpoint"
)


class ModelSource(ApiModel):
    """Where the checkpoint lives: exactly one of ``hostPath`` or ``pvc``."""

    model_config = ConfigDict(json_schema_extra=validations(SOURCE_EXACTLY_ONE))

    host_path: HostPathSource | None = None
    pvc: PvcSource | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        if (self.host_path is None) == (self.pvc is None):
            raise ValueError(SOURCE_EXACTLY_ONE["message"])
        return self


class Quantization(ApiModel):
    """How weights are post-processed once, in the daemon. ``fp8`` is block-wise FP8
    (float8_e4m3fn weights, one float32 scale per block, the DeepSeek-V3 layout)."""

    method: QuantizationMethod = "none"
    weight_block_size: list[Annotated[int, Field(gt=0)]] = Field(
        default=[128, 128], min_length=2, max_length=2, description="FP8 block shape [rows, columns]."
    )


OnChange = Literal["Report", "Reload"]


class Model(ApiModel):
    """The checkpoint and how it is loaded; all of it but onChange enters the weights' fingerprint."""

    source: ModelSource = Field(json_schema_extra=validations(SOURCE_IMMUTABLE))
    revision: str | None = Field(
        default=None, max_length=256, description="Checkpoint revision, recorded in the fingerprint."
    )
    dtype: Dtype = Field(default="auto", description="auto takes the dtype from config.json.")
    quantization: Quantization = Field(default_factory=Quantization, json_schema_extra=default_object(Quantization))
    on_change: OnChange = Field(
        default="Report",
        description="What happens when the daemons report that the checkpoint's bytes changed under them (condition"
        " CheckpointChanged, with an Event). Report: nothing more; they keep serving the bytes they loaded. Reload:"
        " a new daemon generation loads the new bytes and the engines move to it, as for a spec change (blue/green"
        " or node by node, spec.daemon.generationChange). Not part of the daemon spec hash: changing it alone"
        " reloads nothing.",
    )


# --- spec.parallelism, placement, daemon, engine, service ---------------------------------------

RANKS_DIVIDE_NODES = cel(
    "(self.tensor * self.pipeline) % self.nodes == 0",
    "tensor * pipeline (the number of ranks) must be a multiple of nodes",
)


EXPERT_DIVIDES_TENSOR = cel(
    "self.tensor % self.expert == 0",
    "expert must divide tensor: expert-parallel ranks are tensor-parallel ranks, each run of tensor/expert of them "
    "holding 1/expert of the experts",
)


class Parallelism(ApiModel):
    """The parallel layout; ranks per node = tensor × pipeline / nodes."""

    model_config = ConfigDict(json_schema_extra=validations(RANKS_DIVIDE_NODES, EXPERT_DIVIDES_TENSOR))

    tensor: int = Field(default=1, ge=1, le=1024)
    pipeline: int = Field(default=1, ge=1, le=1024)
    nodes: int = Field(default=1, ge=1, le=1024)
    expert: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Mixture-of-experts models: expert-parallel size, dividing tensor. 1 splits every expert over "
        "the tensor-parallel ranks; tensor gives each rank whole experts (1/tensor of them). The daemon refuses a "
        "model whose expert count it does not divide, and any value but 1 for a model without experts.",
    )

    @model_validator(mode="after")
    def _ranks_divide_nodes(self) -> Parallelism:
        if (self.tensor * self.pipeline) % self.nodes:
            raise ValueError(
                f"{RANKS_DIVIDE_NODES['message']} (tensor {self.tensor} * pipeline {self.pipeline}"
                f" = {self.ranks} ranks over {self.nodes} nodes)"
            )
        if self.tensor % self.expert:
            raise ValueError(f"{EXPERT_DIVIDES_TENSOR['message']} (tensor {self.tensor}, expert {self.expert})")
        return self

    @property
    def ranks(self) -> int:
        return self.tensor * self.pipeline

    @property
    def ranks_per_node(self) -> int:
        return self.ranks // self.nodes


class Placement(ApiModel):
    """Which nodes hold the weights; applied to daemon and engine pods alike."""

    node_selector: dict[str, str] | None = None
    affinity: FreeForm | None = Field(default=None, description="A core/v1 Affinity.")
    tolerations: list[FreeForm] | None = Field(default=None, description="core/v1 Tolerations.")


GenerationChange = Literal["Auto", "NodeByNode"]


class Daemon(ApiModel):
    """The per-node daemon that loads, shards and holds the weights."""

    image: str = Field(min_length=1, max_length=1024)
    resources: FreeForm | None = Field(
        default=None,
        description="core/v1 ResourceRequirements of the daemon container. On GPU backends (without gpuAccess dra)"
        " its nvidia.com/gpu count, at least the ranks per node and that number when unset, is requested by the"
        " cache's GPU holder pods (<name>-gpus) instead, so that two daemon generations can share the GPUs.",
    )
    backend: Backend = Field(default="cuda-vmm", description="cpu-shm runs without GPUs.")
    extra_args: list[str] = Field(default=[], description="Appended to the daemon's command line.")
    generation_change: GenerationChange = Field(
        default="Auto",
        description="How a change of what the daemons hold reaches the nodes. Auto: blue/green (the new"
        " generation's daemons load next to the old ones, engines move over, then the old ones go) when every"
        " node reports room for a second copy, otherwise node by node (drain the node's engines, replace its"
        " daemon). NodeByNode: always node by node, never two copies in memory. Not part of the daemon spec"
        " hash: changing it alone reloads nothing.",
    )


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

    @model_validator(mode="after")
    def _unresponsive_floor(self) -> EngineFailover:
        if 0 < self.unresponsive_after_milliseconds < 100:
            raise ValueError(
                f"{UNRESPONSIVE_FLOOR['message']}, not {self.unresponsive_after_milliseconds}: a"
                " healthy engine's answer alone can take that long"
            )
        return self


DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


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


ARTIFACT_CACHE_DEFAULT_BYTES = 8 << 30


class ArtifactCache(ApiModel):
    """A node-local cache of the engines' compile artifacts (vLLM's torch.compile, Inductor and
    Triton output), next to the weights: the first engine of a configuration on a node compiles
    and its daemon publishes the result, later engines with the same key start from it
    (docs/vllm.md, *Compile artifacts*)."""

    max_bytes: int = Field(
        default=ARTIFACT_CACHE_DEFAULT_BYTES,
        ge=1 << 20,
        description="The bound on the node's published entries for this cache, in bytes; the least recently used"
        " entries are evicted beyond it (never one an engine is copying out).",
    )


class Vllm(ApiModel):
    """The engines are vLLM: ``vllm serve`` maps an arena in vLLM's own layout, which the daemons
    build with vLLM's loader (their ``vllm`` profile). The operator derives one list of vLLM
    arguments from the spec (``--dtype``, ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
    ``--enable-expert-parallel``, ``--quantization``, ``--revision``, ``--max-model-len``, then
    ``args``) and gives the very same list to the daemons and the engines, so that both compute
    the same fingerprint. The engine template still supplies image, resources and env; its first
    container's command is rendered here."""

    args: list[str] = Field(
        default=[],
        description="vLLM arguments that shape the weights or the model (for example --kv-cache-dtype, "
        "--hf-overrides, --enforce-eager), given to daemons and engines alike after the ones derived from the "
        "spec. Changing them is a daemon generation change.",
    )
    engine_args: list[str] = Field(
        default=[],
        description="vLLM arguments for the engines only: serving options that leave the weights alone (for "
        "example --max-num-seqs, --gpu-memory-utilization). Changing them rolls the "
        "engines, not the daemons.",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="vLLM's --max-model-len; unset: the model's own context length."
    )
    kv_cache_space_gib: int | None = Field(
        default=None,
        ge=1,
        alias="kvCacheSpaceGiB",
        description="Required on CPU (daemon.backend cpu-shm), refused elsewhere: each engine's KV cache in GiB"
        " (VLLM_CPU_KVCACHE_SPACE). vLLM's automatic CPU sizing subtracts the worker's resident memory, which"
        " counts every mapped weight page as the engine's own, so two engines would each pay for the one"
        " shared copy. On GPUs size the KV cache with --gpu-memory-utilization in engineArgs"
        " (docs/operator.md).",
    )
    artifact_cache: ArtifactCache | None = Field(
        default=None,
        description="Set: engines keep their compile artifacts in a per-node directory the daemon pod owns, keyed"
        " by the weights, vLLM's version and image, the device and vLLM's compilation-relevant configuration;"
        " an engine whose key was published starts from it instead of compiling. Unset (the default): each"
        " engine compiles into its own filesystem. Setting or changing it is a daemon generation change (the"
        " daemons publish and evict).",
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


class Service(ApiModel):
    """The Service that selects the active engines only."""

    name: str | None = Field(default=None, max_length=63, description="Defaults to the WeightCache's name.")
    port: int = Field(default=8000, ge=1, le=65535)
    type: ServiceType = "ClusterIP"


# --- spec.routing ---------------------------------------------------------------------------------

InferencePoolMode = Literal["Managed", "Reference"]
FailureMode = Literal["FailOpen", "FailClose"]
"""The spelling of ``inference.networking.k8s.io/v1`` InferencePool's endpointPickerRef.failureMode."""
POOL_API_VERSION = "inference.networking.k8s.io/v1"
POOL_KIND = "InferencePool"
POOL_PLURAL = "inferencepools"


class EndpointPicker(ApiModel):
    """The endpoint picker (EPP) Service a managed InferencePool names in its endpointPickerRef."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN, description="The picker's Service.")
    port: int = Field(ge=1, le=65535, description="The picker Service's port (its gRPC ext-proc port).")
    failure_mode: FailureMode = Field(
        default="FailClose",
        description="What the gateway does while the picker does not answer: FailClose refuses the request,"
        " FailOpen sends it to any pod of the pool.",
    )


POOL_REFERENCE_NAMED = cel(
    "self.mode != 'Reference' || has(self.name)",
    "inferencePool.mode Reference needs inferencePool.name, the InferencePool to check",
)
POOL_PICKER_MANAGED = cel(
    "self.mode == 'Managed' || !has(self.endpointPickerRef)",
    "inferencePool.endpointPickerRef is rendered into a managed pool only; set it on your own pool in mode Reference",
)


class InferencePoolRouting(ApiModel):
    """Traffic through the Gateway API Inference Extension. A standby engine is Ready (it has mapped
    the weights) but must receive no request, so a pool has to select serving engines only: those
    the Service selects. ``Managed``: the operator creates and owns an InferencePool with exactly the
    Service's selector and keeps it on the serving generation. ``Reference``: the operator checks a
    pool you own against the labels it guarantees on serving engines and says what is wrong in the
    InferencePoolReady condition; it never changes that pool."""

    model_config = ConfigDict(json_schema_extra=validations(POOL_REFERENCE_NAMED, POOL_PICKER_MANAGED))

    mode: InferencePoolMode
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="Managed: the pool's name (defaults to the WeightCache's name). Reference: the pool to check,"
        " in the cache's namespace.",
    )
    endpoint_picker_ref: EndpointPicker | None = Field(
        default=None, description="Managed only: the endpoint picker the pool names; unset, the pool names none."
    )

    @model_validator(mode="after")
    def _consistent(self) -> InferencePoolRouting:
        if self.mode == "Reference" and self.name is None:
            raise ValueError(POOL_REFERENCE_NAMED["message"])
        if self.mode != "Managed" and self.endpoint_picker_ref is not None:
            raise ValueError(POOL_PICKER_MANAGED["message"])
        return self


class Routing(ApiModel):
    """How traffic reaches the serving engines besides the Service."""

    inference_pool: InferencePoolRouting | None = Field(
        default=None,
        description="A Gateway API Inference Extension InferencePool over the serving engines (the"
        " inference.networking.k8s.io/v1 CRD must be installed, and the chart's routing.inferencePool.enabled"
        " set for the operator's rights).",
    )


DRA_NEEDS_GPU = cel(
    "self.engine.gpuAccess != 'dra' || self.daemon.backend != 'cpu-shm'",
    "engine.gpuAccess dra shares a GPU ResourceClaim and needs a GPU daemon backend (cuda-vmm or cuda-ipc)",
)


class WeightCacheSpec(ApiModel):
    """A model kept resident on the selected nodes and the engines that serve it."""

    model_config = ConfigDict(json_schema_extra=validations(DRA_NEEDS_GPU))

    model: Model
    parallelism: Parallelism = Field(default_factory=Parallelism, json_schema_extra=default_object(Parallelism))
    placement: Placement = Field(default_factory=Placement, json_schema_extra=default_object(Placement))
    daemon: Daemon
    engine: Engine
    service: Service = Field(default_factory=Service, json_schema_extra=default_object(Service))
    routing: Routing | None = Field(default=None, description="Unset: the Service is the only way in.")

    @model_validator(mode="after")
    def _dra_needs_gpu(self) -> WeightCacheSpec:
        if self.engine.gpu_access == "dra" and self.daemon.backend == "cpu-shm":
            raise ValueError(DRA_NEEDS_GPU["message"])
        return self


# --- status -------------------------------------------------------------------------------------


class Condition(ApiModel):
    """The Kubernetes condition convention (metav1.Condition): DaemonsReady, EnginesReady,
    Available, Progressing, Degraded, CheckpointChanged, InferencePoolReady."""

    type: str = Field(min_length=1, max_length=316)
    status: ConditionStatus
    reason: str | None = Field(default=None, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
    message: str | None = Field(default=None, max_length=32768)
    last_transition_time: datetime | None = None
    observed_generation: int | None = Field(default=None, ge=0)


class RankStatus(ApiModel):
    """One local rank of a node's daemon, as the daemon pod's status endpoint reports it."""

    rank: int = Field(ge=0)
    ready: bool = False
    bytes: int | None = Field(default=None, ge=0, description="Bytes of the rank's arena.")
    load_seconds: float | None = Field(default=None, ge=0)
    gpu_uuid: str | None = Field(default=None, description="The GPU holding the rank's weights; unset on cpu-shm.")
    source: Literal["disk", "keeper"] | None = Field(
        default=None, description="disk: loaded from the checkpoint; keeper: re-adopted without reading it."
    )
    disk_bytes_read: int | None = Field(
        default=None, ge=0, description="Checkpoint bytes the rank's loader read (0 after a keeper re-adoption)."
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
    seen_at: datetime | None = Field(default=None, description="When the operator saw the change.")


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
    promoted_at: datetime | None = Field(
        default=None, description="When the pass that promoted it began, on the operator's clock (milliseconds)."
    )
    promotion_seconds: float | None = Field(default=None, ge=0, description="From its Ready to promotedAt.")
    retired_at: datetime | None = Field(
        default=None, description="When the pass that first deleted one of the replica's old engines began."
    )
    drain_seconds: float | None = Field(
        default=None, ge=0, description="From retiredAt until none of the replica's old engines was left."
    )


class RolloutStatus(ApiModel):
    """The last (or current) change rolled onto running engines (operator/weightcache_operator/rollout.py)."""

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
    started_at: datetime | None = None
    finished_at: datetime | None = None
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
    created_at: datetime | None = None
    ready_at: datetime | None = None
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

    time: datetime = Field(
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
    failure_api_second: datetime | None = Field(
        default=None,
        description="The failure's timestamp as the API server recorded it (deletionTimestamp less its grace period, "
        "the containers' finishedAt, the condition's lastTransitionTime), which the API keeps to the whole second, "
        "truncated: it says how old a failure already was when the operator first saw it (one that came while no "
        "operator watched), never how fast it was detected. Absent when the API has none (Unresponsive, PodGone).",
    )


class InferencePoolStatus(ApiModel):
    """The InferencePool of spec.routing; the InferencePoolReady condition says whether it selects
    exactly the serving engines."""

    name: str
    mode: InferencePoolMode


class WeightCacheStatus(ApiModel):
    """Written only by the operator, through the status subresource.

    ``readyNodes``, ``activeEngines``, ``standbyEngines`` and ``model`` are summaries for the
    printer columns, which can only show a field, not count or choose between fields."""

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


class WeightCache(ApiModel):
    """A model's weights kept resident on selected nodes, and the engines that map them with
    zero copies. The operator parses objects read from the API server with this model."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["weightcache.io/v1alpha1"] = "weightcache.io/v1alpha1"
    kind: Literal["WeightCache"] = "WeightCache"
    metadata: FreeForm = Field(default_factory=dict)
    spec: WeightCacheSpec
    status: WeightCacheStatus | None = None
