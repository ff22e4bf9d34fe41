"""``weightcache daemon --profile sglang``, one rank: SGLang's own configuration, loading and
post-processing (``EngineRank``); the rest of the rank — order, keeper, peers, publication and
the exec into the serving daemon — is every engine profile's (``engine_profiles.publisher``)."""

from __future__ import annotations

import argparse
from typing import Any

from torch import nn
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import SGLANG_PROFILE

from ..checkpoints.sharding import Layout
from ..engine_profiles.publisher import EngineRank
from ..wire.fingerprint import Fingerprint


class SglangRank(EngineRank):
    profile = SGLANG_PROFILE

    def __init__(self) -> None:
        self.server_args: Any = None
        self.model_config: Any = None
        self.layout = Layout()

    def prepare(self, args: argparse.Namespace, engine_args: list[str], layout: Layout, device: int) -> Fingerprint:
        import sglang

        from . import versions

        versions.check(sglang.__version__)  # what the engine's plug-in would refuse is not published
        from .build import model_config_of, publish_rank
        from .server_args import parse, refuse_quantization, refuse_unservable
        from .stamp import platform_backend, rank_fingerprint

        self.server_args = parse(args.model, engine_args)
        refuse_unservable(self.server_args, args.model, args.tp_size, args.pp_size)
        if args.backend != platform_backend():
            raise WeightCacheError(
                f"--backend {args.backend} does not fit this SGLang: on the CPU (SGLANG_USE_CPU_ENGINE=1, "
                f"--device cpu) it loads onto the CPU (cpu-shm arenas), on NVIDIA GPUs onto the GPU (cuda-vmm "
                f"arenas); use --backend {platform_backend()}"
            )
        self.layout = layout
        publish_rank(self.server_args, layout.tp_rank, layout.pp_rank, device)
        self.model_config = model_config_of(self.server_args, layout.tp_rank)
        refuse_quantization(self.model_config)
        # Before loading: post-processing may rewrite the config's quantization section.
        return rank_fingerprint(
            self.server_args, self.model_config, layout.tp_rank, layout.pp_rank, backend=args.backend, device=device
        )

    def join(self, layout: Layout, rendezvous: str, device: int) -> None:
        from .build import join_rank_group

        join_rank_group(self.server_args, self.model_config, layout.tp_rank, layout.pp_rank, rendezvous, device)

    def load(self, device: int) -> nn.Module:
        from .build import load_rank_model

        return load_rank_model(self.server_args, self.model_config, self.layout.tp_rank, device)
