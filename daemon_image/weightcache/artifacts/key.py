"""What a compile-artifact entry is valid for, and what an engine claims about its staging.

An entry is reused only under the very key it was published under: the key's digest names the
entry's directory and the key itself is stored beside the artifacts, and a lookup compares the
stored key field by field (a digest collision, or an entry renamed by hand, is never reused).
"""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict, Field

DIGEST = re.compile(r"[0-9a-f]{32}")


class ArtifactKey(BaseModel):
    """Everything compiled code depends on beyond the engine's own hashing.

    vLLM keys its compile cache by its config hash, torch's and Inductor's configuration and the
    model's source; that is taken as ``compile_config`` here and kept, and the rest makes an entry
    one engine build's alone: another engine version or image may generate other code for the same
    hash, another device kind other kernels, and other weights belong to another model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: str = Field(min_length=1, max_length=64)
    engine_version: str = Field(min_length=1, max_length=128)
    torch_version: str = Field(min_length=1, max_length=128)
    image: str = Field(default="", max_length=1024)
    """The engine's container image when the operator renders it (``""`` outside Kubernetes)."""
    device: str = Field(min_length=1, max_length=512)
    """``cpu:`` and the ISA flags kernels depend on, or the GPU's name and compute capability."""
    weights: str = Field(min_length=1, max_length=128)
    """A digest of every rank's ``Fingerprint.weights_digest``: the model, its layout and dtype."""
    compile_config: str = Field(min_length=1, max_length=128)
    """The engine's own digest of the settings its compilation depends on (vLLM: ``VllmConfig.compute_hash()``)."""

    @property
    def digest(self) -> str:
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]


class Claim(BaseModel):
    """What an engine writes into its staging directory once it knows its key: the key, and the
    entry it started from (``hit``) or none (a miss: its compilation is new)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: ArtifactKey
    hit: str | None = Field(default=None, pattern=DIGEST.pattern)


class EntryMeta(BaseModel):
    """Written by the publisher beside a published entry's artifacts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    key: ArtifactKey
    bytes: int = Field(ge=0)
    files: int = Field(ge=0)
    published_at: float
