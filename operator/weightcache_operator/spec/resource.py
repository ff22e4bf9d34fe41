"""The WeightCache resource: its API identity, the root of the spec with the rules that span
its parts, and the object as the operator reads it."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from weightcache_operator.spec.base import ApiModel, FreeForm, cel, default_object, validations
from weightcache_operator.spec.engine import Engine
from weightcache_operator.spec.model import Model
from weightcache_operator.spec.nodes import Daemon, Parallelism, Placement
from weightcache_operator.spec.routing import Routing, Service
from weightcache_operator.spec.status import WeightCacheStatus

GROUP = "weightcache.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "WeightCache"
PLURAL = "weightcaches"
SINGULAR = "weightcache"
SHORT_NAMES = ("wc",)


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


class WeightCache(ApiModel):
    """A model's weights kept resident on selected nodes, and the engines that map them with
    zero copies. The operator parses objects read from the API server with this model."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["weightcache.io/v1alpha1"] = "weightcache.io/v1alpha1"
    kind: Literal["WeightCache"] = "WeightCache"
    metadata: FreeForm = Field(default_factory=dict)
    spec: WeightCacheSpec
    status: WeightCacheStatus | None = None
