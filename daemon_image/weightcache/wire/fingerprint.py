"""The fingerprint: everything that decides which bytes a cache holds, computed before loading.

Two parties compute it independently — the daemon from its arguments, the engine from its own —
and weights are mapped only when the two agree. Shard files are identified by name, size,
mtime, inode, ctime and the SHA-256 of their safetensors header (names, dtypes, shapes, offsets)
rather than by a hash of their content: an engine would have to read every byte of its shards
on each start, which is what the cache exists to avoid. Inode and ctime are what a rewrite
cannot restore — a write in place sets the ctime even when ``os.utime`` puts the mtime back, and
a replaced file has a new inode — so no edit goes unnoticed short of resetting the system clock
(docs/architecture.md lists what is left). Copying a checkpoint, or a ``chmod``/``touch`` of a
shard, therefore means a new fingerprint, which errs on the safe side.

Inode and ctime say which file on this node holds the shard, not what the weights are: two nodes
with copies of one checkpoint differ in them. ``digest`` (every field) is what a daemon, its
keeper and its engines compare on one node; ``weights_digest`` leaves those two fields out and is
what nodes compare with each other (the daemon's status report, the operator's status.nodes).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # the model classes here must import without torch (the CLI, the ready file)
    from ..checkpoints.checkpoint import Checkpoint
    from ..checkpoints.quantization import QuantConfig
    from ..checkpoints.sharding import Layout

# Bumped whenever the meaning of the bytes on the wire changes; part of the environment stamp.
PROTOCOL_VERSION = 1


# Fields of a shard stamp that name this node's file rather than the checkpoint's content.
NODE_LOCAL_SHARD_FIELDS = frozenset({"inode", "ctime_ns"})


class ShardStamp(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    size: int
    mtime_ns: int
    header_sha256: str
    inode: int
    ctime_ns: int


class EnvironmentStamp(BaseModel):
    model_config = ConfigDict(frozen=True)

    torch_version: str
    device_kind: str  # "cpu" or the GPU's name
    compute_capability: str | None = None
    driver_version: str | None = None
    cuda_runtime: str | None = None
    backend: str
    access: str = "read-only"  # how engines map the arena; read-write is an explicit opt-in
    protocol_version: int = PROTOCOL_VERSION


class EngineStamp(BaseModel):
    """What another engine's own post-processing makes of the weights (load profiles other than
    the reference one, e.g. ``vllm``): the engine, its version, the profile, and every setting the
    arena's bytes depend on beyond the checkpoint and the layout (platform, quantization config,
    CPU GEMM policy, CPU ISA, ...)."""

    model_config = ConfigDict(frozen=True)

    engine: str
    version: str
    load_profile: str
    settings: dict[str, str]


class Fingerprint(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_path: str
    revision: str
    config_sha256: str
    shards: tuple[ShardStamp, ...]
    tp_size: int
    tp_rank: int
    pp_size: int
    pp_rank: int
    ep_size: int = 1  # MoE: whole experts per rank (ep = tp) or a slice of every expert (1); see Layout
    quantization: str
    quantization_sha256: str
    dtype: str
    layout_version: int
    environment: EnvironmentStamp
    engine: EngineStamp | None = None  # None: the reference profile (weightcache's own loader)

    def _fields(self) -> dict[str, Any]:
        fields = self.model_dump(mode="json")
        if fields["engine"] is None:
            del fields["engine"]  # so the reference profile's digests do not depend on the field's existence
        return fields

    @property
    def digest(self) -> str:
        """Every field: equal only for the same files on the same node (what mapping requires)."""
        return _sha256(self._fields())

    @property
    def weights_digest(self) -> str:
        """Every field but the shards' node-local ones: equal on every node that holds the same
        weights from copies of the same checkpoint."""
        fields = self._fields()
        fields["shards"] = [
            {k: v for k, v in shard.items() if k not in NODE_LOCAL_SHARD_FIELDS} for shard in fields["shards"]
        ]
        return _sha256(fields)

    def differences(self, other: Fingerprint) -> list[str]:
        """Names of the fields that differ, environment fields as ``environment.<field>``, engine
        fields as ``engine.<field>`` and ``engine.settings.<name>``."""
        ours, theirs = self.model_dump(mode="json"), other.model_dump(mode="json")
        fields = []
        for key in ours:
            if key == "environment":
                fields += [f"environment.{k}" for k in ours[key] if ours[key][k] != theirs[key].get(k)]
            elif key == "engine" and ours[key] is not None and theirs[key] is not None:
                fields += _engine_differences(ours[key], theirs[key])
            elif ours[key] != theirs[key]:
                fields.append(key)
        return fields


# What to do about each kind of differing field, first match wins (so ``engine`` itself, a daemon of
# another load profile, comes after its more specific sub-fields). The
# shards (stat + header stamps) or config.json differ when the checkpoint on disk changed after
# the daemon loaded it: no argument of the engine can fix that, only a daemon that loads it again.
_FIXES: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        ("shards", "config_sha256"),
        "the checkpoint on disk changed after the daemon loaded it; restart the daemon so it loads the "
        "checkpoint as it is now (`weightcache status` on the daemon names the changed files; under the "
        "operator, spec.model.onChange: Reload does this with a new daemon generation)",
    ),
    (("model_path",), "give the daemon and the engine the same --model path"),
    (("revision",), "give the daemon and the engine the same --revision"),
    (
        ("tp_size", "tp_rank", "pp_size", "pp_rank", "ep_size"),
        "give the daemon and the engine the same parallel layout (tp/pp/ep sizes and rank)",
    ),
    (
        ("quantization", "quantization_sha256"),
        "give the daemon and the engine the same --quantization (and weight block size)",
    ),
    (("dtype",), "give the daemon and the engine the same --dtype"),
    (
        ("layout_version", "environment.torch_version", "environment.protocol_version"),
        "run the daemon and the engine from the same image (weightcache and torch versions)",
    ),
    (
        (
            "environment.device_kind",
            "environment.compute_capability",
            "environment.driver_version",
            "environment.cuda_runtime",
        ),
        "run the engine on the same GPU model, driver and CUDA runtime as the daemon (the same image, on the daemon's node)",
    ),
    (("environment.backend",), "give the daemon and the engine the same --backend"),
    (("environment.access",), "give the daemon (--engine-access) and the engine the same access mode"),
    (("engine.version",), "run the daemon and the engine with the same engine version (the same image)"),
    (
        ("engine.settings.env",),
        "give the daemon and the engine the same value of the environment variable the field names (the "
        "engine's kernel choice; the operator sets the same on both)",
    ),
    (("engine.settings",), "give the daemon (--engine-args) and the engine the same engine arguments"),
    (("engine", "engine.load_profile", "engine.engine"), "start the daemon with the engine's load profile (--profile)"),
)


def mismatch_fix(fields: list[str]) -> str:
    """What to do about a fingerprint mismatch in ``fields`` (``Fingerprint.differences``): one fix
    per kind of field, each named once, joined with "; ". A field matches a name exactly, or as
    ``<name>.<sub-field>``."""
    fixes: list[str] = []
    for field in fields:
        fix = next(
            (text for prefixes, text in _FIXES if any(field == p or field.startswith(p + ".") for p in prefixes)),
            "restart the daemon and the engine from the same image with the same arguments",
        )
        if fix not in fixes:
            fixes.append(fix)
    return "; ".join(fixes)


def _engine_differences(ours: dict[str, Any], theirs: dict[str, Any]) -> list[str]:
    """``engine.<field>``, and ``engine.settings.<name>`` for each setting that differs."""
    fields = [f"engine.{k}" for k in ours if k != "settings" and ours[k] != theirs[k]]
    names = sorted(ours["settings"].keys() | theirs["settings"].keys())
    return fields + [f"engine.settings.{n}" for n in names if ours["settings"].get(n) != theirs["settings"].get(n)]


def _sha256(fields: dict[str, Any]) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def environment_stamp(backend: str, device: int = 0, access: str = "read-only") -> EnvironmentStamp:
    """The software and hardware the arena's bytes are valid for; GPU fields from ``device``.

    Imports no torch (see gpu_identity): a re-adopting daemon computes this on its critical path."""
    from ..gpu.gpu_identity import gpu_count, gpu_facts, torch_build

    torch_version, cuda_runtime = torch_build()
    gpu: dict[str, Any] = {"device_kind": "cpu"}
    if backend != "cpu-shm":
        gpu = {"device_kind": "no-gpu"}
        if device < gpu_count():
            facts = gpu_facts(device)
            gpu = {
                "device_kind": facts.name,
                "compute_capability": facts.compute_capability,
                "driver_version": facts.driver_version,
                "cuda_runtime": cuda_runtime,
            }
    return EnvironmentStamp(torch_version=torch_version, backend=backend, access=access, **gpu)


def compute(
    checkpoint: Checkpoint,
    layout: Layout,
    quant: QuantConfig,
    dtype: str,
    *,
    revision: str,
    backend: str,
    device: int = 0,
    access: str = "read-only",
) -> Fingerprint:
    from ..checkpoints.manifest import LAYOUT_VERSION

    return Fingerprint(
        model_path=str(checkpoint.path),
        revision=revision,
        config_sha256=checkpoint.config_sha256,
        shards=tuple(ShardStamp(**vars(s)) for s in checkpoint.shards),
        tp_size=layout.tp_size,
        tp_rank=layout.tp_rank,
        pp_size=layout.pp_size,
        pp_rank=layout.pp_rank,
        ep_size=layout.ep_size,
        quantization=quant.method,
        quantization_sha256=quant.sha256(),
        dtype=dtype,
        layout_version=LAYOUT_VERSION,
        environment=environment_stamp(backend, device, access),
    )
