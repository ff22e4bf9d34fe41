"""``weightcache`` command line: daemon, gpu-holder, keeper, status, probe, plan, gen-checkpoint, hf-generate,
demo, bench, engine."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

from weightcache_contract import termination
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import WeightCacheError

from . import logfmt


def _block(text: str) -> tuple[int, int]:
    parts = [int(p) for p in text.replace("x", ",").split(",")]
    if len(parts) != 2:
        raise argparse.ArgumentTypeError("weight block size is two integers, e.g. 128,128")
    return parts[0], parts[1]


def _ranks(text: str) -> list[int]:
    ranks: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            ranks.extend(range(int(lo), int(hi) + 1))
        elif part:
            ranks.append(int(part))
    return ranks


def _add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="checkpoint directory (Hugging Face layout)")
    p.add_argument("--dtype", default="auto", help="auto (from config.json), bfloat16, float16 or float32")
    p.add_argument("--quantization", default="none", help="none or fp8 (block-wise)")
    p.add_argument("--weight-block-size", type=_block, default=None, help="fp8 block, default 128,128")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    _add_checkpoint_args(p)
    p.add_argument("--revision", default="", help="model revision recorded in the fingerprint")
    p.add_argument("--backend", default=None,
                   help="arena backend: cpu-shm, cuda-vmm or cuda-ipc (default: cuda-vmm with a GPU, else cpu-shm)")
    p.add_argument("--device", type=int, default=0, help="CUDA ordinal of this rank's GPU (GPU backends)")


def _add_layout_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--tp-rank", type=int, default=0)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--pp-rank", type=int, default=0)
    p.add_argument("--ep-size", type=int, default=1,
                   help="expert-parallel size (MoE; divides --tp-size): each run of tp/ep ranks holds 1/ep of the "
                        "experts whole instead of a slice of every expert")


def _add_cache_args(p: argparse.ArgumentParser, required: bool) -> None:
    from .wire.rankfiles import default_socket_dir

    p.add_argument("--socket-dir", default=default_socket_dir(), help="directory holding <name>/rank-N.sock")
    p.add_argument("--name", required=required, default=None if required else "default", help="the cache's name")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="weightcache", description=__doc__)
    parser.add_argument("--log-level", default=os.environ.get("WEIGHTCACHE_LOG_LEVEL", "info"))
    sub = parser.add_subparsers(dest="command", required=True)

    d = sub.add_parser("daemon", help="load a checkpoint once and serve it to engines")
    _add_model_args(d)
    _add_layout_args(d)
    _add_cache_args(d, required=True)
    d.add_argument("--ranks", type=_ranks, default=None,
                   help="launch one process per listed global rank (e.g. 0-3) instead of one rank")
    d.add_argument("--socket-group", default=None, help="group allowed to connect (socket mode 0660)")
    d.add_argument("--allow-uid", type=int, action="append", default=[], help="extra uid allowed to connect")
    d.add_argument("--allow-gid", type=int, action="append", default=[], help="extra gid allowed to connect")
    d.add_argument("--engine-access", choices=["read-only", "read-write"], default="read-only",
                   help="how engines map the arena (read-write: cuda-vmm only, opt-in, part of the fingerprint)")
    d.add_argument("--keeper", choices=["auto", "off"], default="auto",
                   help="auto: deposit with / re-adopt from <socket-dir>/keeper.sock when a keeper listens")
    d.add_argument("--load-workers", type=int, default=4, help="threads reading and post-processing tensors")
    d.add_argument("--status-addr", default=None, metavar="HOST:PORT",
                   help="serve GET /status (JSON) and GET /metrics (Prometheus) for the local ranks here; "
                        "off unless given (the operator sets $(POD_IP):9400)")
    d.add_argument("--gpus-file", default=None, metavar="FILE",
                   help="GPU backends: the GPU holder's grant (gpus.json); local rank i uses its i-th GPU, found by "
                        "UUID (waits until a running holder has written it); overrides --device")
    d.add_argument("--synthetic-fill", action="store_true",
                   help="benchmarks only (weightcache bench --synthetic): fill the arena with a byte pattern instead of "
                        "reading the checkpoint; the fingerprint's revision becomes 'synthetic-fill:<revision>', so no "
                        "engine expecting the real weights maps it")
    d.add_argument("--local-index", type=int, default=0,
                   help="this rank's position among the pod's local ranks, picking its GPU of --gpus-file "
                        "(the --ranks launcher sets it)")

    gh = sub.add_parser("gpu-holder", help="book this pod's GPUs for a cache's daemons: write their UUIDs, then wait")
    gh.add_argument("--out", required=True, help="the grant file to write (gpus.json; gpus.lock goes beside it)")
    gh.add_argument("--expect", type=int, default=None,
                    help="GPUs the pod requested; refuse to start when the container sees another number")

    k = sub.add_parser("keeper", help="hold arena fds so caches outlive their daemons (no CUDA)")
    k.add_argument("--socket-dir", default=None)
    k.add_argument("--allow-uid", type=int, action="append", default=[])
    k.add_argument("--allow-gid", type=int, action="append", default=[])
    kc = sub.add_parser("keeper-ctl", help="ask the keeper what it holds, or release a cache's arenas")
    kc.add_argument("action", choices=["list", "release"])
    kc.add_argument("--socket-dir", default=None)
    kc.add_argument("--name", default=None)
    kc.add_argument("--rank", type=int, default=None)

    s = sub.add_parser("status", help="ask a running daemon for its status (JSON)")
    _add_cache_args(s, required=True)
    s.add_argument("--rank", type=int, default=0)

    pr = sub.add_parser("probe", help="exit 0 only if every listed rank is ready: file, live process, answering socket")
    _add_cache_args(pr, required=True)
    pr.add_argument("--ranks", type=_ranks, default=[0])
    pr.add_argument("--gpus-file", default=None, metavar="FILE",
                    help="also require each rank's GPU to be booked by the running GPU holder (its grant file)")

    pl = sub.add_parser("plan", help="dry run: what each rank would hold, from config.json and the headers alone")
    _add_checkpoint_args(pl)
    pl.add_argument("--tp", "--tp-size", dest="tp_size", type=int, default=1, help="tensor-parallel size")
    pl.add_argument("--pp", "--pp-size", dest="pp_size", type=int, default=1, help="pipeline-parallel size")
    pl.add_argument("--ep", "--ep-size", dest="ep_size", type=int, default=1,
                    help="expert-parallel size (MoE; divides --tp)")
    pl.add_argument("--json", action="store_true", help="print the plan as JSON instead of a table")

    g = sub.add_parser("gen-checkpoint", help="write a small real checkpoint with seeded random weights")
    g.add_argument("out")
    g.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "qwen3_moe"])
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--intermediate-size", type=int, default=352)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--vocab-size", type=int, default=1024)
    g.add_argument("--dtype", default="bfloat16")
    g.add_argument("--shards", type=int, default=3)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tie-embeddings", action="store_true")
    g.add_argument("--fp8", action="store_true", help="store block-wise FP8 weights (a pre-quantized checkpoint)")
    g.add_argument("--sparse", action="store_true",
                   help="headers only, tensor bytes left as holes: any size for `weightcache plan`, not for loading")
    g.add_argument("--experts", type=int, default=8, help="qwen3_moe: experts per layer")
    g.add_argument("--experts-per-token", type=int, default=2, help="qwen3_moe: experts routed per token (top-k)")
    g.add_argument("--moe-intermediate-size", type=int, default=128, help="qwen3_moe: each expert's MLP width")

    h = sub.add_parser("hf-generate", help="a transformers model fed by weightcache: greedy completion as JSON")
    _add_model_args(h)
    _add_cache_args(h, required=False)
    h.add_argument("--weights", choices=["off", "client"], default="client")
    h.add_argument("--access", choices=["read-only", "read-write"], default="read-only")
    h.add_argument("--fallback", choices=["disk", "error"], default="disk")
    h.add_argument("--prompt", default="Hello")
    h.add_argument("--max-new-tokens", type=int, default=16)

    m = sub.add_parser("demo", help="the quick start: disk vs cache on a generated checkpoint")
    m.add_argument("--workdir", default=None)
    m.add_argument("--max-new-tokens", type=int, default=16)

    b = sub.add_parser("bench", help="measure disk load, daemon load and map+bind; print a table")
    from .tools.bench import add_arguments

    add_arguments(b)

    e = sub.add_parser("engine", help="the reference engine: a tensor-parallel OpenAI-compatible server")
    from .engine.command import add_arguments as add_engine_arguments

    add_engine_arguments(e)
    return parser


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = build_parser().parse_args(argv)
    logfmt.setup(args.log_level)
    try:
        return _dispatch(args, started)
    except WeightCacheError as exc:
        print(f"weightcache {args.command}: error: {exc}", file=sys.stderr)
        # The one place a process's fatal error becomes its container's termination message.
        termination.write(str(exc))
        return getattr(exc, "exit_code", 2)
    except Exception as exc:
        termination.write(f"unexpected {type(exc).__name__}: {exc} (a bug: please report it with the container's log)")
        raise


def _default_backend(args: argparse.Namespace) -> None:
    if getattr(args, "backend", "unset") is None:
        from .gpu.gpu_identity import gpu_count  # not torch: a restarting daemon must not pay for it

        args.backend = "cuda-vmm" if gpu_count() else "cpu-shm"


def _dispatch(args: argparse.Namespace, started: float) -> int:
    _default_backend(args)
    if args.command in ("keeper", "keeper-ctl") and args.socket_dir is None:
        from .wire.rankfiles import default_socket_dir

        args.socket_dir = default_socket_dir()
    if args.command == "gpu-holder":
        from pathlib import Path

        from .gpu.gpu_holder import run as run_holder

        return run_holder(Path(args.out), args.expect)
    if args.command == "keeper":
        from .daemon.keeper import run as run_keeper

        return run_keeper(args.socket_dir, args.allow_uid, args.allow_gid)
    if args.command == "keeper-ctl":
        from .daemon.keeper import KeeperClient, keeper_socket

        with KeeperClient(keeper_socket(args.socket_dir)) as keeper:
            if args.action == "list":
                print(json.dumps([h.model_dump() for h in keeper.holdings()], indent=2))
            else:
                if not args.name:
                    raise WeightCacheError("keeper-ctl release needs --name")
                print(json.dumps({"released": keeper.release(args.name, args.rank)}))
        return 0
    if args.command == "daemon":
        if args.backend in GPU_BACKENDS:
            # cuInit takes ~0.2 s on an H200; it runs while the imports below do (it drops the GIL).
            from .gpu.gpu_identity import gpu_count

            threading.Thread(target=gpu_count, name="cuinit", daemon=True).start()
        from .daemon.rank import DaemonConfig, launch_local_ranks, run
        from .checkpoints.sharding import Layout

        if args.ranks or args.status_addr:
            # The status endpoint lives in the launcher, so asking for it launches even one rank.
            from weightcache_contract.readonly_http import parse_addr

            ranks = args.ranks or [Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size).rank]
            status_addr = parse_addr(args.status_addr, "--status-addr") if args.status_addr else None
            os.environ["WEIGHTCACHE_LOG_LEVEL"] = args.log_level  # children read it as their default
            passthrough = _daemon_passthrough(args)
            return launch_local_ranks(ranks, args.tp_size, args.pp_size, passthrough, status_addr,
                                      args.socket_dir, args.name, args.gpus_file)
        cfg = DaemonConfig(
            model=args.model, layout=Layout(args.tp_size, args.tp_rank, args.pp_size, args.pp_rank, args.ep_size),
            socket_dir=args.socket_dir, name=args.name, dtype=args.dtype, quantization=args.quantization,
            weight_block_size=args.weight_block_size, backend=args.backend, device=args.device,
            engine_access=args.engine_access, keeper=args.keeper, revision=args.revision,
            socket_group=args.socket_group, allow_uids=args.allow_uid, allow_gids=args.allow_gid,
            load_workers=args.load_workers, gpus_file=args.gpus_file, local_index=args.local_index,
            synthetic_fill=args.synthetic_fill)
        return run(cfg)
    if args.command == "status":
        from .client.weights import DaemonConnection
        from .wire.rankfiles import RankFiles

        with DaemonConnection(RankFiles(args.socket_dir, args.name, args.rank).socket) as conn:
            print(conn.status().model_dump_json(indent=2))
        return 0
    if args.command == "probe":
        from .daemon.probe import probe

        problems = probe(args.socket_dir, args.name, args.ranks, gpus_file=args.gpus_file)
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    if args.command == "plan":
        from .checkpoints.planner import plan_world, render

        world = plan_world(args.model, args.tp_size, args.pp_size, args.ep_size, quantization=args.quantization,
                           weight_block_size=args.weight_block_size, dtype=args.dtype)
        print(json.dumps(world.to_json(), indent=2) if args.json else render(world))
        return 0 if world.ok else 1
    if args.command == "gen-checkpoint":
        from .tools.sample_checkpoints import ModelSpec, write_checkpoint, write_sparse_checkpoint

        spec = ModelSpec(family=args.family, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                         num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads,
                         vocab_size=args.vocab_size, dtype=args.dtype, shards=args.shards, seed=args.seed,
                         tie_word_embeddings=args.tie_embeddings, fp8=args.fp8, num_experts=args.experts,
                         num_experts_per_tok=args.experts_per_token, moe_intermediate_size=args.moe_intermediate_size)
        print(write_sparse_checkpoint(args.out, spec) if args.sparse else write_checkpoint(args.out, spec))
        return 0
    if args.command == "hf-generate":
        from .checkpoints.checkpoint import open_checkpoint
        from .client.weights import Weights, load_weights
        from .checkpoints.loader import resolve_dtype
        from .tools.reference_hf import dump, generate_report
        from .checkpoints.sharding import Layout

        def load() -> "Weights":
            return load_weights(
                args.model, Layout(), socket_dir=args.socket_dir if args.weights == "client" else None,
                name=args.name if args.weights == "client" else None, fallback=args.fallback, dtype=args.dtype,
                quantization=args.quantization, weight_block_size=args.weight_block_size, revision=args.revision,
                backend=args.backend, device=args.device, access=args.access)

        dtype = resolve_dtype(args.dtype, open_checkpoint(args.model))
        print(dump(generate_report(args.model, load, dtype, args.prompt, args.max_new_tokens, started)))
        return 0
    if args.command == "demo":
        from .tools.demo import default_workdir, run as run_demo

        return run_demo(args.workdir or default_workdir(), args.max_new_tokens)
    if args.command == "bench":
        from .tools.bench import run as run_bench

        return run_bench(args)
    if args.command == "engine":
        from .engine.command import run as run_engine

        return run_engine(args)
    raise AssertionError(args.command)


def _daemon_passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--model", args.model, "--revision", args.revision, "--dtype", args.dtype,
           "--quantization", args.quantization, "--backend", args.backend,
           "--socket-dir", args.socket_dir, "--name", args.name, "--engine-access", args.engine_access,
           "--keeper", args.keeper, "--load-workers", str(args.load_workers), "--ep-size", str(args.ep_size)]
    if args.weight_block_size:
        out += ["--weight-block-size", f"{args.weight_block_size[0]},{args.weight_block_size[1]}"]
    if args.socket_group:
        out += ["--socket-group", args.socket_group]
    for uid in args.allow_uid:
        out += ["--allow-uid", str(uid)]
    for gid in args.allow_gid:
        out += ["--allow-gid", str(gid)]
    if args.gpus_file:
        out += ["--gpus-file", args.gpus_file]
    if args.synthetic_fill:
        out += ["--synthetic-fill"]
    return out
