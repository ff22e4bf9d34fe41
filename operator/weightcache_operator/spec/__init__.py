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

One module per part of the API: ``model`` (the checkpoint), ``nodes`` (parallelism, placement,
daemon), ``engine`` (with ``vllm``), ``routing`` (Service and InferencePool), ``status``, and
``resource`` (the root spec, the rules across its parts, the object); ``base`` is what they share.
Import from the package: this module is its public surface.
"""

from weightcache_operator.spec.engine import (
    ENGINE_DRAIN_S,
    PRE_STOP_SLEEP_DEFAULT_S,
    STOP_GRACE_S,
    UNRESPONSIVE_FLOOR,
    Dra,
    Engine,
    EngineFailover,
    EnginePodSpec,
    EngineRollout,
    EngineTemplate,
    GpuAccess,
    WeightFallback,
)
from weightcache_operator.spec.model import (
    SOURCE_EXACTLY_ONE,
    SOURCE_IMMUTABLE,
    Dtype,
    HostPathSource,
    Model,
    ModelSource,
    OnChange,
    PvcSource,
    Quantization,
    QuantizationMethod,
)
from weightcache_operator.spec.nodes import (
    EXPERT_DIVIDES_TENSOR,
    RANKS_DIVIDE_NODES,
    Daemon,
    GenerationChange,
    Parallelism,
    Placement,
    Seeding,
    SeedingMode,
)
from weightcache_operator.spec.resource import (
    API_VERSION,
    DRA_NEEDS_GPU,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    WeightCache,
    WeightCacheSpec,
)
from weightcache_operator.spec.routing import (
    POOL_API_VERSION,
    POOL_KIND,
    POOL_PICKER_MANAGED,
    POOL_PLURAL,
    POOL_REFERENCE_NAMED,
    EndpointPicker,
    FailureMode,
    InferencePoolMode,
    InferencePoolRouting,
    Routing,
    Service,
    ServiceType,
)
from weightcache_operator.spec.sglang import Sglang
from weightcache_operator.spec.status import (
    ArtifactStatus,
    CheckpointReloadStatus,
    Condition,
    ConditionStatus,
    EngineStartStatus,
    EngineStatus,
    FailoverSignal,
    FailoverStatus,
    InferencePoolStatus,
    NodeStatus,
    Phase,
    PlanStatus,
    RankStatus,
    RolloutReplicaStatus,
    RolloutStatus,
    WeightCacheStatus,
)
from weightcache_operator.spec.vllm import ARTIFACT_CACHE_DEFAULT_BYTES, ArtifactCache, Vllm

__all__ = [
    # resource
    "API_VERSION",
    "DRA_NEEDS_GPU",
    "GROUP",
    "KIND",
    "PLURAL",
    "SHORT_NAMES",
    "SINGULAR",
    "VERSION",
    "WeightCache",
    "WeightCacheSpec",
    # model
    "SOURCE_EXACTLY_ONE",
    "SOURCE_IMMUTABLE",
    "Dtype",
    "HostPathSource",
    "Model",
    "ModelSource",
    "OnChange",
    "PvcSource",
    "Quantization",
    "QuantizationMethod",
    # nodes
    "EXPERT_DIVIDES_TENSOR",
    "RANKS_DIVIDE_NODES",
    "Daemon",
    "GenerationChange",
    "Parallelism",
    "Placement",
    "Seeding",
    "SeedingMode",
    # engine, vllm
    "ARTIFACT_CACHE_DEFAULT_BYTES",
    "ENGINE_DRAIN_S",
    "PRE_STOP_SLEEP_DEFAULT_S",
    "STOP_GRACE_S",
    "UNRESPONSIVE_FLOOR",
    "ArtifactCache",
    "Dra",
    "Engine",
    "EngineFailover",
    "EnginePodSpec",
    "EngineRollout",
    "EngineTemplate",
    "GpuAccess",
    "Sglang",
    "Vllm",
    "WeightFallback",
    # routing
    "POOL_API_VERSION",
    "POOL_KIND",
    "POOL_PICKER_MANAGED",
    "POOL_PLURAL",
    "POOL_REFERENCE_NAMED",
    "EndpointPicker",
    "FailureMode",
    "InferencePoolMode",
    "InferencePoolRouting",
    "Routing",
    "Service",
    "ServiceType",
    # status
    "ArtifactStatus",
    "CheckpointReloadStatus",
    "Condition",
    "ConditionStatus",
    "EngineStartStatus",
    "EngineStatus",
    "FailoverSignal",
    "FailoverStatus",
    "InferencePoolStatus",
    "NodeStatus",
    "Phase",
    "PlanStatus",
    "RankStatus",
    "RolloutReplicaStatus",
    "RolloutStatus",
    "WeightCacheStatus",
]
