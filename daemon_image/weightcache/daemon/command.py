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

from ..arguments import add_cache_args, add_layout_args, add_model_args, add_peer_args, ranks

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
(``daemon.rank.launch_local_ranks``)."""


def add_arguments(d: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        *add_model_args(d),
        *add_layout_args(d),
        *add_cache_args(d, required=True),
        d.add_argument(
            "--ranks",
            type=ranks,
            default=None,
            help="launch one process per listed global rank (e.g. 0-3) instead of one rank",
        ),
        d.add_argument("--socket-group", default=None, help="group allowed to connect (socket mode 0660)"),
        *add_peer_args(d),
        d.add_argument(
            "--engine-access",
            choices=["read-only", "read-write"],
            default="read-only",
            help="how engines map the arena (read-write: cuda-vmm only, opt-in, part of the fingerprint)",
        ),
        d.add_argument(
            "--keeper",
            choices=["auto", "off"],
            default="auto",
            help="auto: deposit with / re-adopt from <socket-dir>/keeper.sock when a keeper listens",
        ),
        d.add_argument("--load-workers", type=int, default=4, help="threads reading and post-processing tensors"),
        d.add_argument(
            "--checkpoint-poll-seconds",
            type=float,
            default=5.0,
            metavar="S",
            help="how often each rank stats its checkpoint to report (and, for equal bytes under a new file "
            "identity, adopt) a change on disk; inotify wakes it sooner on Linux; 0 turns the watch off",
        ),
        d.add_argument(
            "--status-addr",
            default=None,
            metavar="HOST:PORT",
            help="serve GET /status (JSON) and GET /metrics (Prometheus) for the local ranks here; "
            "off unless given (the operator sets $(POD_IP):9400)",
        ),
        d.add_argument(
            "--gpus-file",
            default=None,
            metavar="FILE",
            help="GPU backends: the GPU holder's grant (gpus.json); local rank i uses its i-th GPU, found "
            "by UUID (waits until a running holder has written it); overrides --device",
        ),
        d.add_argument(
            "--synthetic-fill",
            action="store_true",
            help="benchmarks only (weightcache bench --synthetic): fill the arena with a byte pattern instead "
            "of reading the checkpoint; the fingerprint's revision becomes 'synthetic-fill:<revision>', "
            "so no engine expecting the real weights maps it",
        ),
        d.add_argument(
            "--profile",
            choices=["reference", "vllm"],
            default="reference",
            help="reference: weightcache's own loader (engines: the reference engine, transformers); "
            "vllm: vLLM's loader and post-processing for this rank, for engines run with "
            "--load-format weightcache (needs --vllm-args; see docs/vllm.md)",
        ),
        d.add_argument(
            "--vllm-args",
            default=None,
            metavar="JSON",
            help="--profile vllm: a JSON list of the vLLM engine arguments the engine gets after "
            '`vllm serve MODEL` (e.g. \'["--dtype","bfloat16","--tensor-parallel-size","2"]\'); '
            "the arena's fingerprint comes from them",
        ),
        d.add_argument(
            "--vllm-dist-init",
            default=None,
            metavar="tcp://HOST:PORT",
            help=argparse.SUPPRESS,  # set by the --ranks launcher: the local ranks' gloo rendezvous
        ),
        d.add_argument(
            "--artifact-dir",
            default=None,
            metavar="DIR",
            help="keep the node's engine compile artifacts here: publish what engines run under "
            "`weightcache artifacts-run` staged, evict beyond --artifact-max-bytes, report hits in /status "
            "(docs/vllm.md, Compile artifacts); off unless given",
        ),
        d.add_argument(
            "--artifact-max-bytes",
            type=int,
            default=8 << 30,
            metavar="N",
            help="the bound on --artifact-dir's published entries; least recently used ones go first",
        ),
        d.add_argument("--handoff-state", default=None, help=argparse.SUPPRESS),  # set by handoff.exec_daemon
        d.add_argument(
            "--local-index",
            type=int,
            default=0,
            help="this rank's position among the pod's local ranks, picking its GPU of --gpus-file "
            "(the --ranks launcher sets it)",
        ),
    ]


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
    from .rank import DaemonConfig, launch_local_ranks
    from .rank import run as run_rank

    if args.ranks or args.status_addr or args.artifact_dir:
        # The status endpoint and the artifact publisher live in the launcher, so asking for
        # either launches even one rank.
        from weightcache_contract.readonly_http import parse_addr

        ranks = args.ranks or [Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size).rank]
        status_addr = parse_addr(args.status_addr, "--status-addr") if args.status_addr else None
        os.environ["WEIGHTCACHE_LOG_LEVEL"] = args.log_level  # children read it as their default
        child_args = rank_argv(args)
        if args.profile == "vllm":
            child_args += ["--vllm-dist-init", vllm_rendezvous(ranks, args.tp_size, args.pp_size)]
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


def vllm_rendezvous(ranks: list[int], tp_size: int, pp_size: int) -> str:
    """A loopback ``tcp://`` address where the pod's ``vllm``-profile ranks form one gloo world.

    vLLM's layers read their tensor- and pipeline-parallel rank from its process groups while they
    are built and loaded, so every rank of the world must join; a loopback port keeps them on this
    node, so the pod must hold all of them."""
    import socket

    from weightcache_contract.errors import WeightCacheError

    if sorted(ranks) != list(range(tp_size * pp_size)):
        raise WeightCacheError(
            f"--profile vllm loads all ranks of one engine together on one node, but --ranks lists {ranks} of "
            f"a world of {tp_size * pp_size}; give this pod --ranks 0-{tp_size * pp_size - 1}"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"
