"""``spec.model``: the checkpoint and how it is loaded."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from weightcache_operator.spec.base import ApiModel, cel, default_object, validations

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
QuantizationMethod = Literal["none", "fp8"]


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
