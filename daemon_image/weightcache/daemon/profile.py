"""The ``reference`` load profile: the daemon's own loader (``checkpoints``: our sharding tables,
FP8 post-processing, experts stacked as transformers fuses them), for the reference engine and
transformers models."""

from __future__ import annotations

import argparse

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import REFERENCE_PROFILE

from ..profiles import LoadProfile, register_profile


@register_profile(REFERENCE_PROFILE)
class Reference(LoadProfile):
    def check(self, args: argparse.Namespace) -> None:
        if args.vllm_args is not None:
            raise WeightCacheError("--vllm-args belongs to --profile vllm; add --profile vllm or drop --vllm-args")

    def run_rank(self, args: argparse.Namespace) -> int:
        from .command import run

        return run(args)
