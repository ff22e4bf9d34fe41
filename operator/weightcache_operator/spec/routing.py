"""``spec.service`` and ``spec.routing``: how traffic reaches the serving engines, through the
Service and optionally a Gateway API Inference Extension InferencePool."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from weightcache_operator.spec.base import DNS_SUBDOMAIN, ApiModel, cel, validations

ServiceType = Literal["ClusterIP", "NodePort", "LoadBalancer"]


class Service(ApiModel):
    """The Service that selects the active engines only."""

    name: str | None = Field(default=None, max_length=63, description="Defaults to the WeightCache's name.")
    port: int = Field(default=8000, ge=1, le=65535)
    type: ServiceType = "ClusterIP"


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
