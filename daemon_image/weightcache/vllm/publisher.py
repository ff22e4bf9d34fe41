"""``weightcache daemon --profile vllm``, one rank: vLLM's own configuration, loading and
post-processing (``EngineRank``); the rest of the rank — order, keeper, peers, publication and
the exec into the serving daemon — is every engine profile's (``engine_profiles.publisher``).

The fingerprint comes from vLLM's config code (``EngineArgs`` → ``VllmConfig`` →
``stamp.rank_fingerprint``), also on a restart that re-adopts from the keeper: 18 s to ready on the
loaded 2-core CPU machine instead of a fraction of a second, for settings vLLM defines."""

from __future__ import annotations

import argparse
from typing import Any

from torch import nn
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import VLLM_PROFILE

from ..checkpoints.sharding import Layout
from ..engine_profiles.publisher import EngineRank
from ..wire.fingerprint import Fingerprint
from . import startup
from .engine_args import engine_config


class VllmRank(EngineRank):
    profile = VLLM_PROFILE

    def __init__(self) -> None:
        self.config: Any = None  # vLLM's VllmConfig, once prepared

    def prepare(self, args: argparse.Namespace, engine_args: list[str], layout: Layout, device: int) -> Fingerprint:
        startup.disable()  # vLLM loads the plug-in here too; a daemon is no engine starting
        import vllm

        from . import versions

        versions.check(vllm.__version__)  # what the engine's plug-in would refuse is not published
        self.config = engine_config(args.model, engine_args, args.tp_size, args.pp_size)

        from .stamp import platform_backend, rank_fingerprint

        if args.backend != platform_backend():
            raise WeightCacheError(
                f"--backend {args.backend} does not fit this vLLM build: its CPU build loads onto the CPU (cpu-shm "
                f"arenas), its CUDA build onto the GPU (cuda-vmm arenas); use --backend {platform_backend()}"
            )
        # Before loading: vLLM's post-processing may rewrite the config's quantization section.
        return rank_fingerprint(self.config, layout.tp_rank, layout.pp_rank, backend=args.backend, device=device)

    def join(self, layout: Layout, rendezvous: str, device: int) -> None:
        from .build import join_rank_group

        join_rank_group(self.config, layout.rank, rendezvous, device)

    def load(self, device: int) -> nn.Module:
        from .build import load_rank_model, refuse_unpublishable

        model_config = self.config.model_config
        # What an engine could not map is refused before a byte is loaded. A withdrawn arena passed
        # this check when it was published (the quantization is in its fingerprint).
        return load_rank_model(
            self.config,
            model_config,
            self.config.load_config,
            check=lambda m: refuse_unpublishable(m, model_config),
            keep_consumed=True,
        )
