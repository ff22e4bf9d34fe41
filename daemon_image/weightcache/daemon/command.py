"""``weightcache daemon``: its flags, defined once, and what it runs.

With ``--ranks`` (or ``--status-addr``) this process is the launcher of the pod's local ranks and
starts one ``weightcache daemon`` per rank; each child gets every flag of this command from the
same definitions (``rank_argv``) except the ones the launcher sets per rank or keeps for itself.
The module is imported whenever the ``weightcache`` parser is built, so it imports nothing heavy
at the top: a re-adopting daemon must start without torch.
"""

from __future__ import annotations

import argparse
import os
import threading

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import add_daemon_arguments

from ..profiles import get_profile

LAUNCHER_FLAGS = frozenset(
    {
        "ranks",
        "status_addr",
        "device",
        "local_index",
        "tp_size",
        "tp_rank",
        "pp_size",
        "pp_rank",
        "vllm_dist_init",
        "handoff_state",
        "artifact_dir",
        "artifact_max_bytes",
    }
)
"""Flags a rank does not get from its launcher: the launcher's own, and the ones it sets per rank
(``daemon.launcher.launch_local_ranks``)."""


def add_arguments(d: argparse.ArgumentParser) -> list[argparse.Action]:
    from ..wire.rankfiles import default_socket_dir

    return add_daemon_arguments(d, default_socket_dir())


def rank_argv(args: argparse.Namespace) -> list[str]:
    """The flags every rank of ``daemon --ranks`` is started with: each flag of this command but
    ``LAUNCHER_FLAGS``, as parsed into ``args``."""
    out: list[str] = []
    for action in add_arguments(argparse.ArgumentParser(add_help=False)):
        if action.dest in LAUNCHER_FLAGS:
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest)
        if isinstance(value, bool):
            out += [flag] if value else []
        elif isinstance(value, list):
            for item in value:
                out += [flag, str(item)]
        elif isinstance(value, tuple):
            out += [flag, ",".join(str(v) for v in value)]
        elif value is not None:
            out += [flag, str(value)]
    return out


def run(args: argparse.Namespace) -> int:
    if args.backend in GPU_BACKENDS and not args.handoff_state:
        # (A handed-over arena comes with its GPU's identity: the serving image never touches CUDA.)
        # cuInit takes ~0.2 s on an H200; it runs while the imports below do (it drops the GIL).
        from ..gpu.gpu_identity import gpu_count

        threading.Thread(target=gpu_count, name="cuinit", daemon=True).start()
    from ..checkpoints.sharding import Layout

    if args.ranks or args.status_addr or args.artifact_dir:
        # The status endpoint and the artifact publisher live in the launcher, so asking for
        # either launches even one rank.
        from weightcache_contract.readonly_http import parse_addr

        from .launcher import launch_local_ranks

        ranks = args.ranks or [Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size).rank]
        status_addr = parse_addr(args.status_addr, "--status-addr") if args.status_addr else None
        os.environ["WEIGHTCACHE_LOG_LEVEL"] = args.log_level  # children read it as their default
        child_args = rank_argv(args) + get_profile(args.profile).rank_args(args, ranks)
        publisher = None
        if args.artifact_dir:
            from ..artifacts.publisher import Publisher

            publisher = Publisher(args.artifact_dir, args.artifact_max_bytes)
            publisher.create()
        return launch_local_ranks(
            ranks,
            args.tp_size,
            args.pp_size,
            child_args,
            status_addr,
            args.socket_dir,
            args.name,
            args.gpus_file,
            publisher,
        )
    from .rank import DaemonConfig
    from .rank import run as run_rank

    cfg = DaemonConfig(
        model=args.model,
        layout=Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size),
        socket_dir=args.socket_dir,
        name=args.name,
        dtype=args.dtype,
        quantization=args.quantization,
        weight_block_size=args.weight_block_size,
        backend=args.backend,
        device=args.device,
        engine_access=args.engine_access,
        keeper=args.keeper,
        revision=args.revision,
        socket_group=args.socket_group,
        allow_uids=args.allow_uid,
        allow_gids=args.allow_gid,
        load_workers=args.load_workers,
        gpus_file=args.gpus_file,
        local_index=args.local_index,
        synthetic_fill=args.synthetic_fill,
        handoff_state=args.handoff_state,
        checkpoint_poll_s=args.checkpoint_poll_seconds,
    )
    return run_rank(cfg)
