"""The ``vllm`` load profile: each rank runs vLLM's own loader and post-processing, publishes the
result and execs into the daemon's serving path (``publisher``). Imports no vLLM until a rank runs."""

from __future__ import annotations

import argparse
import socket
from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import VLLM_PROFILE

from ..profiles import LoadProfile, register_profile


@register_profile(VLLM_PROFILE)
class Vllm(LoadProfile):
    def rank_fields(self, args: argparse.Namespace, ranks: list[int]) -> dict[str, Any]:
        return {"vllm_dist_init": vllm_rendezvous(ranks, args.tp_size, args.pp_size)}

    def run_rank(self, args: argparse.Namespace) -> int:
        from .publisher import run

        return run(args)


def vllm_rendezvous(ranks: list[int], tp_size: int, pp_size: int) -> str:
    """A loopback ``tcp://`` address where the pod's ``vllm``-profile ranks form one gloo world.

    vLLM's layers read their tensor- and pipeline-parallel rank from its process groups while they
    are built and loaded, so every rank of the world must join; a loopback port keeps them on this
    node, so the pod must hold all of them."""
    if sorted(ranks) != list(range(tp_size * pp_size)):
        raise WeightCacheError(
            f"--profile vllm loads all ranks of one engine together on one node, but --ranks lists {ranks} of "
            f"a world of {tp_size * pp_size}; give this pod --ranks 0-{tp_size * pp_size - 1}"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"
