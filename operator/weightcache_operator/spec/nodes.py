"""``spec.parallelism``, ``spec.placement`` and ``spec.daemon``: how the weights are split into
ranks, which nodes hold them and the per-node daemon that loads and holds them."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator
from weightcache_contract.backends import Backend

from weightcache_operator.spec.base import ApiModel, FreeForm, cel, default_object, validations

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

SeedingMode = Literal["Peers", "Off"]


class Seeding(ApiModel):
    """Seeding a starting daemon from a Ready daemon of the same cache on another node instead of
    reading the checkpoint from disk (docs/operator.md, *Seeding from peers*)."""

    mode: SeedingMode = Field(
        default="Peers",
        description="Peers: a starting daemon asks the cache's Ready daemons of its generation (listed in the"
        " <name>-seed-peers ConfigMap) for each rank before reading the disk, and every daemon serves its ranks to"
        " the others, with the credential of the <name>-seeding Secret; every chunk is verified and on any failure"
        " the daemon falls back to the disk. Off: daemons read the disk only, neither fetch nor serve, and the"
        " operator creates neither object.",
    )
    max_mib_per_second: float = Field(
        default=4096.0,
        gt=0,
        alias="maxMiBPerSecond",
        description="The most one rank sends to starting peers, in MiB/s, all of them together.",
    )
    max_clients: int = Field(
        default=2, ge=1, description="Starting daemons one rank seeds at once; more are told to try another peer."
    )
    streams: int = Field(default=4, ge=1, le=64, description="TCP connections one seed of a rank uses in parallel.")
    stall_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A peer that sends nothing for this long, or slower than minMiBPerSecond over it, is given up"
        " for the next peer or the disk.",
    )
    min_mib_per_second: float = Field(
        default=1.0,
        ge=0,
        alias="minMiBPerSecond",
        description="The slowest a peer may send, in MiB/s over stallSeconds, before it is given up.",
    )


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
    seeding: Seeding = Field(
        default_factory=Seeding,
        json_schema_extra=default_object(Seeding),
        description="Copying ranks from Ready peer daemons instead of the disk. Not part of the daemon spec hash:"
        " changing it reloads nothing; daemon pods started after the change (new nodes, restarts) use it.",
    )
