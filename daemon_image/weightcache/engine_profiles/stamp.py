"""Pieces of an engine profile's fingerprint that every engine computes alike."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..checkpoints.checkpoint import open_checkpoint
from ..checkpoints.manifest import LAYOUT_VERSION
from ..wire.fingerprint import EngineStamp, Fingerprint, ShardStamp, environment_stamp

# CPU features that change what an engine's CPU post-processing writes (vLLM: MoE experts packed
# for the ISA they will run on, ``vec`` or ``amx``; block-FP8 weights VNNI-packed only on AMX;
# oneDNN/ATen bf16 kernels chosen by AVX-512 BF16; SGLang: AMX-packed weights where its CPU kernels
# run). An arena packed on one host must not be mapped on a host with other kernels, so the engine
# compares these with the daemon's.
ISA_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def cpu_isa(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The ``ISA_FLAGS`` this CPU has (first processor's flags), plus torch's CPU capability."""
    import torch

    flags: set[str] = set()
    with open(cpuinfo) as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.partition(":")[2].split())
                break
    have = [flag for flag in ISA_FLAGS if flag in flags]
    return ",".join([*have, f"torch={torch.backends.cpu.get_cpu_capability()}"])


def sha256_of(value: Any) -> str:
    """A setting's digest: a dict as JSON with sorted keys, an object through ``to_dict`` or ``vars``."""
    if value is not None and not isinstance(value, dict):
        value = value.to_dict() if hasattr(value, "to_dict") else vars(value)
    return hashlib.sha256(json.dumps(plain(value), sort_keys=True, default=str).encode()).hexdigest()


def plain(value: Any, within: tuple[int, ...] = ()) -> Any:
    """``value`` with every object that has ``to_dict`` (a transformers config) replaced by its settings,
    and a reference back to an enclosing one by its class name: SGLang's FP8 quantization section
    holds the model's config itself, whose ``repr`` would serialise the section again, without end."""
    if isinstance(value, dict):
        return {str(k): plain(v, within) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, within) for v in value]
    if hasattr(value, "to_dict") and not isinstance(value, type):
        if id(value) in within:
            return f"<the enclosing {type(value).__name__}>"
        return plain(value.to_dict(), (*within, id(value)))
    return value


def engine_fingerprint(
    model_path: str,
    *,
    revision: str | None,
    tp: tuple[int, int],
    pp: tuple[int, int],
    model_config: Any,
    backend: str,
    device: int,
    engine: EngineStamp,
) -> Fingerprint:
    """A rank's fingerprint from an engine's view: the checkpoint's identity (config and shard
    stamps, read without weights), the layout (``tp``, ``pp``: size and rank), dtype and
    quantization as the engine's ``model_config`` resolved them, the environment, and ``engine``
    (what the engine's loading depends on beyond them; expert placement included, so ``ep_size``
    stays 1)."""
    checkpoint = open_checkpoint(model_path, stamps_only=True)
    quant_config = getattr(model_config.hf_config, "quantization_config", None)
    return Fingerprint(
        model_path=str(checkpoint.path),
        revision=revision or "",
        config_sha256=checkpoint.config_sha256,
        shards=tuple(ShardStamp(**vars(s)) for s in checkpoint.shards),
        tp_size=tp[0],
        tp_rank=tp[1],
        pp_size=pp[0],
        pp_rank=pp[1],
        ep_size=1,
        quantization=str(model_config.quantization or "none"),
        quantization_sha256=sha256_of(quant_config),
        dtype=str(model_config.dtype).removeprefix("torch."),
        layout_version=LAYOUT_VERSION,
        environment=environment_stamp(backend, device),
        engine=engine,
    )
