"""Flags that several ``weightcache`` commands share, defined once: argparse types and groups.

Each ``add_*`` returns the actions it added, so a command can pass its own flags on to child
processes from the same definitions (``daemon --ranks`` does, for every rank it launches).
Importing this module stays cheap and torch-free: it runs on every start of every command.
"""

from __future__ import annotations

import argparse


def block(text: str) -> tuple[int, int]:
    """``--weight-block-size``: two integers, ``128,128`` or ``128x128``."""
    parts = [int(p) for p in text.replace("x", ",").split(",")]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("weight block size is two integers, e.g. 128,128")
    return parts[0], parts[1]


def ranks(text: str) -> list[int]:
    """A rank list: ``0-3``, ``0,2`` or both (``0-1,4``)."""
    found: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            found.extend(range(int(lo), int(hi) + 1))
        elif part:
            found.append(int(part))
    return found


def add_checkpoint_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        p.add_argument("--model", required=True, help="checkpoint directory (Hugging Face layout)"),
        p.add_argument("--dtype", default="auto", help="auto (from config.json), bfloat16, float16 or float32"),
        p.add_argument("--quantization", default="none", help="none or fp8 (block-wise)"),
        p.add_argument("--weight-block-size", type=block, default=None, help="fp8 block, default 128,128"),
    ]


def add_model_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        *add_checkpoint_args(p),
        p.add_argument("--revision", default="", help="model revision recorded in the fingerprint"),
        p.add_argument(
            "--backend",
            default=None,
            help="arena backend: cpu-shm, cuda-vmm or cuda-ipc (default: cuda-vmm with a GPU, else cpu-shm)",
        ),
        p.add_argument("--device", type=int, default=0, help="CUDA ordinal of this rank's GPU (GPU backends)"),
    ]


def add_layout_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        p.add_argument("--tp-size", type=int, default=1),
        p.add_argument("--tp-rank", type=int, default=0),
        p.add_argument("--pp-size", type=int, default=1),
        p.add_argument("--pp-rank", type=int, default=0),
        p.add_argument(
            "--ep-size",
            type=int,
            default=1,
            help="expert-parallel size (MoE; divides --tp-size): each run of tp/ep ranks holds 1/ep of the "
            "experts whole instead of a slice of every expert",
        ),
    ]


def add_cache_args(p: argparse.ArgumentParser, required: bool) -> list[argparse.Action]:
    from .wire.rankfiles import default_socket_dir

    return [
        p.add_argument("--socket-dir", default=default_socket_dir(), help="directory holding <name>/rank-N.sock"),
        p.add_argument("--name", required=required, default=None if required else "default", help="the cache's name"),
    ]


def add_peer_args(p: argparse.ArgumentParser) -> list[argparse.Action]:
    """Who may connect to a socket besides its owner and root (daemon and keeper)."""
    return [
        p.add_argument("--allow-uid", type=int, action="append", default=[], help="extra uid allowed to connect"),
        p.add_argument("--allow-gid", type=int, action="append", default=[], help="extra gid allowed to connect"),
    ]


def default_backend(args: argparse.Namespace) -> None:
    """``--backend`` left out: ``cuda-vmm`` when a GPU is visible, else ``cpu-shm``."""
    if getattr(args, "backend", "unset") is None:
        from .gpu.gpu_identity import gpu_count  # not torch: a restarting daemon must not pay for it

        args.backend = "cuda-vmm" if gpu_count() else "cpu-shm"
