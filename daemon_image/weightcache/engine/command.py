"""``weightcache engine``: arguments (each also settable from the environment) and dispatch.

Every flag ``--foo-bar`` can come from ``WEIGHTCACHE_ENGINE_FOO_BAR``
(``weightcache_contract.launch.engine_env_name``; the operator renders ``EngineEnv`` in those
names). A flag on the command line wins over the environment. Without ``--tp-rank`` this process is the
launcher of all ``--tp-size`` ranks; with it, it is that one rank (how a launcher starts its
children, and how ranks can be started one by one).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import Any

from weightcache_contract.launch import block, engine_env_name

log = logging.getLogger("weightcache.engine")


def _env(flag: str, default: Any = None) -> Any:
    return os.environ.get(engine_env_name(flag), default)


# (flag, type, default, help); the table is also what the launcher passes on.
FLAGS: tuple[tuple[str, Any, Any, str], ...] = (
    ("model", str, None, "checkpoint directory (Hugging Face layout)"),
    ("host", str, "127.0.0.1", "HTTP listen address (rank 0)"),
    ("port", int, 8000, "HTTP port (rank 0)"),
    ("tp-size", int, 1, "tensor-parallel size: number of rank processes (on all nodes together)"),
    (
        "ep-size",
        int,
        1,
        "expert-parallel size (MoE; divides tp-size): each run of tp/ep ranks holds 1/ep of the "
        "experts whole; 1 splits every expert over all ranks. Must match the daemon's --ep-size",
    ),
    ("nnodes", int, 1, "nodes the engine spans; each runs tp-size / nnodes ranks under its own launcher"),
    (
        "node-rank",
        int,
        0,
        "this node's place: it runs ranks [node-rank·r, (node-rank+1)·r), r = tp-size / nnodes; "
        "node 0 runs rank 0, which serves HTTP",
    ),
    (
        "dist-addr",
        str,
        None,
        "host:port where rank 0 hosts the rendezvous (default: a free local port; "
        "required with --nnodes > 1: node 0's address, reachable from the other nodes)",
    ),
    ("dist-timeout", float, 30.0, "seconds a collective may wait for a peer while serving before the engine fails"),
    ("startup-timeout", float, 1800.0, "seconds ranks may wait for each other at start-up (rendezvous, loading)"),
    ("weight-cache-mode", str, "off", "off (disk), client (map from a running daemon) or daemon (spawn daemons)"),
    ("weight-cache-fallback", str, "disk", "client/daemon mode without a matching cache: disk or error"),
    ("socket-dir", str, None, "daemon socket directory (default: the daemon's default)"),
    ("name", str, None, "the cache's name"),
    ("dtype", str, "auto", "auto (from config.json), bfloat16, float16 or float32"),
    ("quantization", str, "none", "none or fp8 (block-wise)"),
    ("weight-block-size", block, None, "fp8 block, default 128,128"),
    ("revision", str, "", "model revision recorded in the fingerprint"),
    (
        "backend",
        str,
        "cpu-shm",
        "arena backend; with a GPU backend (cuda-vmm, cuda-ipc) the engine computes on the GPU "
        "that holds the weights, one GPU per rank, and all-reduces with nccl",
    ),
    ("served-model-name", str, None, "model id in the API (default: the checkpoint directory's name)"),
    ("max-model-len", int, None, "context length (default and maximum: max_position_embeddings)"),
    ("max-active", int, 8, "requests decoded concurrently (interleaved token by token)"),
    ("max-queue", int, 64, "requests admitted or waiting before new ones get 429"),
    ("drain-timeout", float, 30.0, "seconds SIGTERM waits for in-flight requests"),
    ("threads", int, None, "torch threads per rank (default: 1 per rank when tp > 1, else torch's default)"),
    ("daemon-timeout", float, 600.0, "daemon mode: seconds to wait for spawned daemons to become ready"),
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    for flag, kind, default, text in FLAGS:
        value = _env(flag, default)
        # A string default (from the environment) is converted by argparse only when `engine` is the
        # command, so a bad value is a clean usage error there and harmless to other commands.
        p.add_argument(f"--{flag}", type=kind, default=value, help=f"{text} [env {engine_env_name(flag)}]")
    p.add_argument(
        "--tp-rank",
        type=int,
        default=_env("tp-rank"),
        help=f"run only this rank (default: launch all ranks) [env {engine_env_name('tp-rank')}]",
    )


def _rank_argv(args: argparse.Namespace, overrides: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for flag, _, _, _ in FLAGS:
        value = overrides.get(flag, getattr(args, flag.replace("-", "_")))
        if value is None:
            continue
        if isinstance(value, tuple):
            value = ",".join(str(v) for v in value)
        out += [f"--{flag}", str(value)]
    return out


def run(args: argparse.Namespace) -> int:
    from weightcache_contract.errors import WeightCacheError

    if not args.model:
        raise WeightCacheError("--model (or WEIGHTCACHE_ENGINE_MODEL) is required")
    from .config import ModelConfig

    ModelConfig.from_checkpoint(args.model).check_tensor_parallel(args.tp_size, args.ep_size)  # fail before starting
    from .launcher import local_ranks

    local_ranks(args.tp_size, args.nnodes, args.node_rank)  # a bad node layout fails here, by name
    if args.nnodes > 1 and not args.dist_addr:
        raise WeightCacheError(
            "--nnodes > 1 needs --dist-addr (or WEIGHTCACHE_ENGINE_DIST_ADDR): the host:port of "
            "node 0's rendezvous, which every node's ranks dial"
        )
    source = _source(args)
    launcher = args.tp_rank is None and args.tp_size > 1
    if source.device == "cuda":
        from ..gpu.gpu_identity import gpu_count, start_primary_context

        if not launcher:
            # The driver's start and the GPU's context are made beside the imports
            # below (the driver calls drop the GIL); torch adopts the context on its first call.
            threading.Thread(target=_quietly, args=(start_primary_context,), name="cuda-context", daemon=True).start()
        elif not gpu_count():  # the launcher needs no torch: the driver API answers "is there a GPU"
            raise WeightCacheError(_NO_GPU.format(backend=args.backend))
    if launcher:
        return _launch(args)
    if args.tp_rank is None:
        args.tp_rank = 0  # one rank: this process is it, no launcher needed
    from .timeline import Timeline

    timeline = Timeline(rank=args.tp_rank)
    from .rank import EngineOptions, run_rank  # torch: the "imports" phase

    if args.tp_rank == 0:
        from . import server  # noqa: F401 - rank 0's HTTP server (aiohttp), imported within the phase

    if source.device == "cuda" and not gpu_count():
        raise WeightCacheError(_NO_GPU.format(backend=args.backend))
    timeline.mark("imports")
    opts = EngineOptions(
        source=source,
        tp_size=args.tp_size,
        tp_rank=args.tp_rank,
        ep_size=args.ep_size,
        dist_addr=args.dist_addr or "127.0.0.1:29500",
        dist_timeout_s=args.dist_timeout,
        startup_timeout_s=args.startup_timeout,
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        max_active=args.max_active,
        max_queue=args.max_queue,
        drain_timeout_s=args.drain_timeout,
        threads=args.threads,
    )
    if source.mode == "daemon":  # a no-op probe when the launcher has already seen to all ranks
        from .weights import ensure_daemons

        ensure_daemons(source, [args.tp_rank], args.tp_size, args.ep_size)
    code = run_rank(opts, timeline)
    # Leave without interpreter teardown: destructors of a process group whose peer died can abort
    # (SIGABRT) and turn a clean exit code into a crash; everything worth keeping is already done.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


_NO_GPU = (
    "--backend {backend} keeps weights in GPU memory, but this process sees no CUDA device; use --backend cpu-shm here"
)


def _quietly(start: Any) -> None:
    """Run an early start-up step on its thread; a failure shows again, with its own message, where
    the main thread needs the result (``gpu_count``, or torch's first CUDA call)."""
    try:
        start()
    except Exception:  # noqa: BLE001
        log.debug("early CUDA start failed", exc_info=True)


def _source(args: argparse.Namespace) -> Any:
    from ..wire.rankfiles import default_socket_dir
    from .weights import WeightSource

    return WeightSource(
        model=args.model,
        mode=args.weight_cache_mode,
        fallback=args.weight_cache_fallback,
        socket_dir=args.socket_dir or default_socket_dir(),
        name=args.name,
        dtype=args.dtype,
        quantization=args.quantization,
        weight_block_size=args.weight_block_size,
        revision=args.revision,
        backend=args.backend,
        daemon_timeout_s=args.daemon_timeout,
    )


def _launch(args: argparse.Namespace) -> int:
    from .launcher import free_port, launch, local_ranks

    source = _source(args)
    ranks = local_ranks(args.tp_size, args.nnodes, args.node_rank)
    overrides: dict[str, Any] = {"dist-addr": args.dist_addr or f"127.0.0.1:{free_port()}"}
    if source.mode == "daemon":
        from .weights import ensure_daemons

        done = ensure_daemons(source, ranks, args.tp_size, args.ep_size)
        log.info("daemons", extra={"fields": {k: v for k, v in done.items() if v is not None}})
    return launch(_rank_argv(args, overrides), args.tp_size, gpus=source.device == "cuda", ranks=ranks)
