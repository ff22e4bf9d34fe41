"""The data plane's side of the flags defined in ``weightcache_contract.launch``: the defaults
that depend on where a command runs (the socket directory, from the environment; the arena
backend, from the GPUs visible). Importing this module stays cheap and torch-free: it runs on
every start of every command.
"""

from __future__ import annotations

import argparse

from weightcache_contract import launch


def add_cache_args(p: argparse.ArgumentParser, required: bool) -> list[argparse.Action]:
    from .wire.rankfiles import default_socket_dir

    return launch.add_cache_args(p, default_socket_dir(), required)


def default_backend(args: argparse.Namespace) -> None:
    """``--backend`` left out: ``cuda-vmm`` when a GPU is visible, else ``cpu-shm``."""
    if getattr(args, "backend", "unset") is None:
        from .gpu.gpu_identity import gpu_count  # not torch: a restarting daemon must not pay for it

        args.backend = "cuda-vmm" if gpu_count() else "cpu-shm"
