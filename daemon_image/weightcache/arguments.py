"""Flags that several ``weightcache`` commands share: argparse types and groups, defined once in
``weightcache_contract.launch`` (the operator renders daemon commands from the same definitions).

Each ``add_*`` returns the actions it added, so a command can pass its own flags on to child
processes from the same definitions (``daemon --ranks`` does, for every rank it launches).
Importing this module stays cheap and torch-free: it runs on every start of every command.
"""

from __future__ import annotations

import argparse

from weightcache_contract import launch
from weightcache_contract.launch import (
    add_checkpoint_args,
    add_layout_args,
    add_model_args,
    add_peer_args,
    block,
    ranks,
)

__all__ = [
    "add_cache_args",
    "add_checkpoint_args",
    "add_layout_args",
    "add_model_args",
    "add_peer_args",
    "block",
    "default_backend",
    "ranks",
]


def add_cache_args(p: argparse.ArgumentParser, required: bool) -> list[argparse.Action]:
    from .wire.rankfiles import default_socket_dir

    return launch.add_cache_args(p, default_socket_dir(), required)


def default_backend(args: argparse.Namespace) -> None:
    """``--backend`` left out: ``cuda-vmm`` when a GPU is visible, else ``cpu-shm``."""
    if getattr(args, "backend", "unset") is None:
        from .gpu.gpu_identity import gpu_count  # not torch: a restarting daemon must not pay for it

        args.backend = "cuda-vmm" if gpu_count() else "cpu-shm"
