"""Pieces of an engine profile's fingerprint that every engine computes alike."""

from __future__ import annotations

import hashlib
import json
from typing import Any

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
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()
