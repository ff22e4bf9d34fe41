"""The load profile of an engine (``weightcache.profiles.LoadProfile``): every rank of the pod's
world joins one loopback rendezvous, and each runs the shared publisher with the engine's
``EngineRank``. Imports no torch and no engine until a rank runs."""

from __future__ import annotations

import argparse
import socket
from typing import TYPE_CHECKING, Any

from weightcache_contract.errors import WeightCacheError

from ..profiles import LoadProfile

if TYPE_CHECKING:
    from .publisher import EngineRank


class EngineLoadProfile(LoadProfile):
    """A subclass names its engine's ``EngineRank`` (importing the engine only inside ``engine_rank``)."""

    def engine_rank(self) -> EngineRank:
        raise NotImplementedError(f"load profile {self.name!r} does not implement engine_rank")

    def rank_fields(self, args: argparse.Namespace, ranks: list[int]) -> dict[str, Any]:
        return {"dist_init": rendezvous(self.name, ranks, args.tp_size, args.pp_size)}

    def run_rank(self, args: argparse.Namespace) -> int:
        from .publisher import run

        return run(args, self.engine_rank())


def rendezvous(profile: str, ranks: list[int], tp_size: int, pp_size: int) -> str:
    """A loopback ``tcp://`` address where the pod's ranks of an engine profile form one world.

    An engine's layers read their tensor- and pipeline-parallel rank from its process groups while
    they are built and loaded, so every rank of the world must join; a loopback port keeps them on
    this node, so the pod must hold all of them."""
    if sorted(ranks) != list(range(tp_size * pp_size)):
        raise WeightCacheError(
            f"--profile {profile} loads all ranks of one engine together on one node, but --ranks lists {ranks} "
            f"of a world of {tp_size * pp_size}; give this pod --ranks 0-{tp_size * pp_size - 1}"
        )
    return loopback()


def loopback() -> str:
    """A free loopback ``tcp://`` address (a world of one without the launcher still needs one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"
