"""The ``reference`` load profile: the daemon's own loader (``checkpoints``: our sharding tables,
FP8 post-processing, experts stacked as transformers fuses them), for the reference engine and
transformers models."""

from __future__ import annotations

import argparse

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import REFERENCE_PROFILE

from ..profiles import LoadProfile, known_profiles, register_profile


@register_profile(REFERENCE_PROFILE)
class Reference(LoadProfile):
    def check(self, args: argparse.Namespace) -> None:
        if args.engine_args is not None:
            raise WeightCacheError(
                "--engine-args are an engine's own arguments, which the reference loader does not read; "
                f"add --profile <the engine's> (one of: {', '.join(p for p in known_profiles() if p != self.name)}) "
                "or drop --engine-args"
            )

    def run_rank(self, args: argparse.Namespace) -> int:
        from .command import run

        return run(args)
