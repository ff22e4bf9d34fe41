"""``weightcache daemon``: its flags, defined once, and what it runs.

With ``--ranks`` (or ``--status-addr``) this process is the launcher of the pod's local ranks and
starts one ``weightcache daemon`` per rank; each child gets every flag of this command from the
same typed definition (``rank_args``) except the ones the launcher sets per rank or keeps for itself.
The module is imported whenever the ``weightcache`` parser is built, so it imports nothing heavy
at the top: a re-adopting daemon must start without torch.
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import STATUS_ADDR, DaemonArgs, add_daemon_arguments

from .. import logfmt
from ..profiles import get_profile


def add_arguments(d: argparse.ArgumentParser) -> list[argparse.Action]:
    from ..wire.rankfiles import default_socket_dir

    return add_daemon_arguments(d, default_socket_dir())


def rank_args(args: argparse.Namespace) -> DaemonArgs:
    """What every rank of ``daemon --ranks`` is started with: this command's flags as parsed into
    ``args``, less the ones the launcher keeps for itself (its ranks, status endpoint and artifact
    publisher) or sets per rank (the rank's place in the layout, its GPU, a profile's
    ``rank_fields``), and a handed-over arena's state, which only a publisher's exec carries."""
    return DaemonArgs.from_namespace(
        args,
        ranks=None,
        status_addr=None,
        artifact_dir=None,
        artifact_max_bytes=None,
        handoff_state=None,
        dist_init=None,
    )


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
        status_addr = parse_addr(args.status_addr, STATUS_ADDR.flag) if args.status_addr else None
        os.environ[logfmt.LEVEL_ENV] = args.log_level  # children read it as their default
        child = rank_args(args).but(**get_profile(args.profile).rank_fields(args, ranks))
        publisher = None
        if args.artifact_dir:
            from ..artifacts.publisher import Publisher

            publisher = Publisher(args.artifact_dir, args.artifact_max_bytes)
            publisher.create()
        return launch_local_ranks(
            ranks,
            child,
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
        **seeding_fields(args),
    )
    return run_rank(cfg)


def seeding_fields(args: argparse.Namespace) -> dict[str, Any]:
    """``DaemonConfig``'s seeding fields from the flags; refuses a half-configured seeding."""
    from weightcache_contract.errors import WeightCacheError
    from weightcache_contract.launch import SEED_CREDENTIAL_FILE, SEED_LISTEN, SEED_PEERS_FILE
    from weightcache_contract.readonly_http import parse_addr

    from ..seeding.client import SeedSettings

    wanted = [o.flag for o in (SEED_LISTEN, SEED_PEERS_FILE) if getattr(args, o.dest)]
    if wanted and not args.seed_credential_file:
        raise WeightCacheError(
            f"{' and '.join(wanted)} need {SEED_CREDENTIAL_FILE.flag}: seeds are served and fetched only with the "
            "cache's credential"
        )
    if args.seed_streams < 1 or args.seed_max_clients < 1 or args.seed_stall_seconds <= 0:
        raise WeightCacheError("--seed-streams and --seed-max-clients must be at least 1, --seed-stall-seconds above 0")
    fields: dict[str, Any] = {}
    if args.seed_listen:
        host, port = parse_addr(args.seed_listen, SEED_LISTEN.flag)
        fields["seed_listen"] = (host, port + args.local_index)
        fields["seed_max_clients"] = args.seed_max_clients
        fields["seed_max_bytes_per_s"] = args.seed_max_mib_s * 2**20
    if args.seed_credential_file:
        fields["seed_credential_file"] = args.seed_credential_file
    if args.seed_peers_file:
        fields["seed"] = SeedSettings(
            peers_file=args.seed_peers_file,
            credential_file=args.seed_credential_file,
            node_name=args.node_name,
            streams=args.seed_streams,
            stall_s=args.seed_stall_seconds,
            min_bytes_per_s=args.seed_min_mib_s * 2**20,
        )
    return fields
