"""``weightcache engine``: arguments (each also settable from the environment) and dispatch.

The flags are ``weightcache_contract.launch.EngineArgs``; every flag ``--foo-bar`` can come from
``WEIGHTCACHE_ENGINE_FOO_BAR`` (``engine_env_name``), which is how the operator renders engine pods
(``EngineArgs.to_env``). A flag on the command line wins over the environment. Without ``--tp-rank`` this process is the
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

from weightcache_contract.launch import MODEL, EngineArgs, add_engine_arguments

log = logging.getLogger("weightcache.engine")


def add_arguments(p: argparse.ArgumentParser) -> None:
    # A value from the environment is converted by argparse only when `engine` is the command, so
    # a bad one is a clean usage error there (naming the variable) and harmless to other commands.
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from weightcache_contract.errors import WeightCacheError

    if not args.model:
        raise WeightCacheError(f"{MODEL.flag} (or {EngineArgs.variable('model')}) is required")
    from .config import ModelConfig

    ModelConfig.from_checkpoint(args.model).check_tensor_parallel(args.tp_size, args.ep_size)  # fail before starting
    from .launcher import local_ranks

    local_ranks(args.tp_size, args.nnodes, args.node_rank)  # a bad node layout fails here, by name
    if args.nnodes > 1 and not args.dist_addr:
        raise WeightCacheError(
            f"--nnodes > 1 needs --dist-addr (or {EngineArgs.variable('dist_addr')}): the host:port of "
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
    engine = EngineArgs.from_namespace(args, dist_addr=args.dist_addr or f"127.0.0.1:{free_port()}")
    if source.mode == "daemon":
        from .weights import ensure_daemons

        done = ensure_daemons(source, ranks, args.tp_size, args.ep_size)
        log.info("daemons", extra={"fields": {k: v for k, v in done.items() if v is not None}})
    return launch(engine, gpus=source.device == "cuda", ranks=ranks)
