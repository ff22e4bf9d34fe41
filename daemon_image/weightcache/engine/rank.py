"""One rank process from start to exit: join the group, bind weights, warm up, then serve or follow.

Rank 0 starts its HTTP server first — liveness must answer while weights load — and does the
rest on a start-up thread that then becomes the scheduler thread. Other ranks have no server:
they mirror rank 0's steps until told to stop. Either way, losing a peer is an exception in a
collective (the group has a timeout; rank 0 sends heartbeats), and the process exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..checkpoints.sharding import Layout
from .config import ModelConfig
from .metrics import Metrics, engine_metrics
from .model import Model
from .parallel import Group, init_group
from .scheduler import Event, Leader, Request, SamplingParams, Worker, follow
from .timeline import Timeline
from .tokenizer import Tokenizer
from .weights import WeightSource, load_rank

if TYPE_CHECKING:
    from .server import EngineState

log = logging.getLogger("weightcache.engine")

EXIT_RANK_FAILURE = 3


@dataclass
class EngineOptions:
    source: WeightSource
    tp_size: int = 1
    tp_rank: int = 0
    ep_size: int = 1
    dist_addr: str = "127.0.0.1:29500"
    dist_timeout_s: float = 30.0
    startup_timeout_s: float = 1800.0
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_active: int = 8
    max_queue: int = 64
    drain_timeout_s: float = 30.0
    threads: int | None = None  # torch intra-op threads per rank; default 1 when tp > 1 on CPU
    warmup_tokens: int = 2


def run_rank(opts: EngineOptions, timeline: Timeline) -> int:
    threads = opts.threads or (1 if opts.tp_size > 1 else None)
    if threads:
        torch.set_num_threads(threads)
    if opts.source.device == "cuda":
        # cuBLAS loads and makes its handle on the first matmul; let that happen while this thread
        # starts the server and maps the weights (torch drops the GIL inside its operators).
        threading.Thread(target=_warm_cublas, name="warm-cublas", daemon=True).start()
    if opts.tp_rank == 0:
        return asyncio.run(_serve(opts, timeline))
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 0 drains, then tells us to stop
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        worker, _ = _start(opts, timeline)
        follow(worker)
    except Exception as exc:
        log.error("rank failed", extra={"fields": {"rank": opts.tp_rank, "error": str(exc)}})
        return EXIT_RANK_FAILURE
    worker.group.close()
    log.info("rank stopped", extra={"fields": {"rank": opts.tp_rank}})
    return 0


def _start(opts: EngineOptions, timeline: Timeline) -> tuple[Worker, list[dict[str, Any]]]:
    """Distributed init → weights → model; returns the worker and every rank's start-up report."""
    if opts.source.device == "cuda":
        # The launcher gives each rank one visible GPU (CUDA_VISIBLE_DEVICES), so it is device 0.
        torch.cuda.set_device(0)
    group: Group = init_group(
        opts.tp_rank, opts.tp_size, opts.dist_addr, opts.source.device, opts.dist_timeout_s, opts.startup_timeout_s
    )
    timeline.mark("distributed_init")
    cfg = ModelConfig.from_checkpoint(opts.source.model)
    weights, report = load_rank(opts.source, Layout(opts.tp_size, opts.tp_rank, ep_size=opts.ep_size))
    model = Model(cfg, weights.tensors, weights.aliases, group, _block_of(opts.source), opts.ep_size)
    model.keep_alive = weights  # the mapping (or the disk buffer) lives as long as the model
    timeline.mark("weights_bound")  # every weight checked; layers make their views on first use
    if weights.arena is not None:  # zero copy, checked on the live engine: every weight is a view of the arena
        lo, hi = weights.arena.address_range  # (this makes every layer's views, which the warm-up would do)
        report["weights_in_arena"] = all(lo <= t.data_ptr() < hi for _, t in model.weights())
    log.info("weights", extra={"fields": {k: v for k, v in report.items() if v is not None}})
    ranks = group.gather_json(
        {"rank": opts.tp_rank, "pid": os.getpid(), "weights": report, "startup": dict(timeline.marks)}
    )
    return Worker(model, group), ranks


def _warm_cublas() -> None:
    try:
        torch.cuda.set_device(0)  # as _start does: the launcher leaves each rank one visible GPU
        x = torch.ones((64, 64), dtype=torch.bfloat16, device="cuda")
        (x @ x).sum().item()
    except Exception:  # noqa: BLE001 - the warm-up's real forward reports any CUDA problem by name
        log.debug("cuBLAS warm-up failed", exc_info=True)


def _block_of(source: WeightSource) -> tuple[int, int] | None:
    from ..checkpoints.checkpoint import open_checkpoint
    from ..checkpoints.quantization import resolve

    if source.quantization == "none":
        return None
    checkpoint = open_checkpoint(source.model)
    try:
        return resolve(source.quantization, checkpoint.quantization_config, source.weight_block_size).weight_block_size
    finally:
        checkpoint.close()


def _record_ranks(metrics: Metrics, ranks: list[dict[str, Any]]) -> None:
    for info in ranks:
        w, rank = info["weights"], info["rank"]
        metrics.set("weightcache_engine_weight_mode", 1.0, rank=rank, mode=w["mode"], requested=w["mode_requested"])
        metrics.set("weightcache_engine_weight_bind_seconds", w["seconds"], rank=rank)
        metrics.set("weightcache_engine_weight_bytes", w["bytes_mapped"], rank=rank, source="mapped")
        metrics.set("weightcache_engine_weight_bytes", w["bytes_loaded"], rank=rank, source="loaded")
        metrics.inc(
            "weightcache_engine_weight_fallbacks_total",
            1.0 if w["fallback_reason"] and w["mode_requested"] != "off" else 0.0,
            rank=rank,
        )
        if rank != 0:
            for phase, seconds in info["startup"].items():
                metrics.set("weightcache_engine_startup_seconds", seconds, rank=rank, phase=phase)


def _warm_up(leader: Leader, tokens: int) -> None:
    """One real request through every rank: first-call costs (allocator, kernels) are paid here."""
    done = threading.Event()
    errors: list[str] = []

    def sink(event: Event) -> None:
        if event.kind == "error":
            errors.append(event.text)
        if event.kind != "token":
            done.set()

    leader.submit(Request([0, 1, 2, 3], SamplingParams(max_tokens=tokens, ignore_eos=True), sink))
    while not done.wait(0.1):
        if leader.failure is not None:
            raise RuntimeError(f"warm-up failed: {leader.failure}")
    if errors:
        raise RuntimeError(f"warm-up failed: {errors[0]}")


async def _serve(opts: EngineOptions, timeline: Timeline) -> int:
    from aiohttp import web

    from .server import EngineState, build_app  # aiohttp: rank 0 only, the other ranks serve nothing

    cfg = ModelConfig.from_checkpoint(opts.source.model)
    max_len = min(opts.max_model_len or cfg.max_position_embeddings, cfg.max_position_embeddings)
    state = EngineState(
        model_name=opts.served_model_name or os.path.basename(os.path.normpath(opts.source.model)),
        max_model_len=max_len,
        max_queue=opts.max_queue,
    )
    metrics = engine_metrics()
    app = build_app(state, metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, opts.host, opts.port)
    await site.start()
    log.info("listening", extra={"fields": {"host": opts.host, "port": opts.port}})

    loop = asyncio.get_running_loop()
    finished = asyncio.Event()
    exit_code = 0
    term = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, term.set)
    loop.add_signal_handler(signal.SIGINT, term.set)

    def engine_thread() -> None:
        nonlocal exit_code
        try:
            worker, ranks = _start(opts, timeline)
            state.ranks = [{"rank": r["rank"], "pid": r["pid"], "weights": r["weights"]} for r in ranks]
            _record_ranks(metrics, ranks)
            leader = Leader(worker, Tokenizer(opts.source.model, cfg.eos_token_ids), opts.max_active)
            state.leader, state.tokenizer = leader, leader.tokenizer
            runner_thread = threading.Thread(target=_run_leader, args=(leader,), name="scheduler", daemon=True)
            runner_thread.start()
            _warm_up(leader, opts.warmup_tokens)
            timeline.mark("warmup")
            state.ready = True
            timeline.mark("ready")
            for phase, seconds in timeline.marks.items():
                metrics.set("weightcache_engine_startup_seconds", seconds, rank=0, phase=phase)
            runner_thread.join()
            if leader.failure is not None:
                raise leader.failure
            worker.group.close()
        except BaseException as exc:
            state.failure = str(exc) or type(exc).__name__
            log.error("engine failed", extra={"fields": {"error": state.failure}})
            exit_code = EXIT_RANK_FAILURE
        finally:
            loop.call_soon_threadsafe(finished.set)

    thread = threading.Thread(target=engine_thread, name="engine", daemon=True)
    thread.start()
    waiter = asyncio.ensure_future(term.wait())
    done_waiter = asyncio.ensure_future(finished.wait())
    await asyncio.wait({waiter, done_waiter}, return_when=asyncio.FIRST_COMPLETED)
    if term.is_set() and not finished.is_set():
        exit_code = await _drain(state, site, app, opts.drain_timeout_s, finished)
    await runner.cleanup()
    log.info("exiting", extra={"fields": {"code": exit_code}})
    return exit_code


def _run_leader(leader: Leader) -> None:
    try:
        leader.run()
    except BaseException as exc:  # recorded in leader.failure; the engine thread reports it
        log.error("scheduler stopped", extra={"fields": {"error": str(exc)}})


async def _drain(state: EngineState, site: Any, app: Any, deadline_s: float, finished: asyncio.Event) -> int:
    """SIGTERM: refuse new work, let in-flight requests finish (up to the deadline), stop every rank."""
    state.draining = True
    started = time.monotonic()
    log.info("draining", extra={"fields": {"inflight": len(app["inflight"]), "deadline_s": deadline_s}})
    await site.stop()  # stop listening; established connections carry on
    while (app["inflight"] or (state.leader and state.leader.pending)) and time.monotonic() - started < deadline_s:
        if finished.is_set():
            break
        await asyncio.sleep(0.05)
    leftover = len(app["inflight"])
    if state.leader is not None:
        state.leader.stop()
    else:
        # Still starting up: nothing in flight; the start-up thread cannot be interrupted, so just go.
        return 0
    try:
        await asyncio.wait_for(finished.wait(), timeout=max(deadline_s - (time.monotonic() - started), 5.0))
    except TimeoutError:
        log.error("ranks did not stop in time")
        return EXIT_RANK_FAILURE
    log.info("drained", extra={"fields": {"seconds": f"{time.monotonic() - started:.3f}", "unfinished": leftover}})
    return 0 if state.failure is None else EXIT_RANK_FAILURE
