"""The small ``weightcache`` commands: each one's flags and its handler.

``daemon``, ``engine`` and ``bench`` have modules of their own (``daemon.command``,
``engine.command``, ``tools.bench``). A handler imports what it runs when it is called, never at
the top: this module is imported whenever the parser is built, and the probe, the keeper and a
re-adopting daemon must start without torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import (
    DTYPE,
    GPUS_FILE,
    NAME,
    RANKS,
    SOCKET_DIR,
    add_keeper_arguments,
    add_model_args,
    add_plan_arguments,
)

from .arguments import add_cache_args


def daemon(args: argparse.Namespace) -> int:
    """``weightcache daemon``: one rank loads through its ``--profile`` (``profiles.get_profile``);
    the ``--ranks`` launcher of any profile and the serving of a publisher's handed-over arena are
    ``daemon.command``."""
    from .daemon.command import run
    from .profiles import get_profile

    if args.handoff_state:
        return run(args)  # serving a handed-over arena is the same for every profile (checked before the exec)
    profile = get_profile(args.profile)
    profile.check(args)
    if args.ranks or args.status_addr:
        return run(args)
    return profile.run_rank(args)


def gpu_holder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="the grant file to write (gpus.json; gpus.lock goes beside it)")
    p.add_argument(
        "--expect",
        type=int,
        default=None,
        help="GPUs the pod requested; refuse to start when the container sees another number",
    )


def gpu_holder(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .gpu.gpu_holder import run

    return run(Path(args.out), args.expect)


def keeper_arguments(p: argparse.ArgumentParser) -> None:
    add_keeper_arguments(p)


def keeper(args: argparse.Namespace) -> int:
    from .daemon.keeper import run
    from .wire.rankfiles import default_socket_dir

    return run(args.socket_dir or default_socket_dir(), args.allow_uid, args.allow_gid)


def keeper_ctl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "release"])
    SOCKET_DIR.add_to(p)
    NAME.add_to(p)
    p.add_argument("--rank", type=int, default=None)


def keeper_ctl(args: argparse.Namespace) -> int:
    from .daemon.keeper import KeeperClient, keeper_socket
    from .wire.rankfiles import default_socket_dir

    with KeeperClient(keeper_socket(args.socket_dir or default_socket_dir())) as held:
        if args.action == "list":
            print(json.dumps([h.model_dump() for h in held.holdings()], indent=2))
        else:
            if not args.name:
                raise WeightCacheError("keeper-ctl release needs --name")
            print(json.dumps({"released": held.release(args.name, args.rank)}))
    return 0


def status_arguments(p: argparse.ArgumentParser) -> None:
    add_cache_args(p, required=True)
    p.add_argument("--rank", type=int, default=0)


def status(args: argparse.Namespace) -> int:
    from .client.weights import DaemonConnection
    from .wire.rankfiles import RankFiles

    with DaemonConnection(RankFiles(args.socket_dir, args.name, args.rank).socket) as conn:
        reply = conn.status()
    print(reply.model_dump_json(indent=2))
    if reply.checkpoint is not None and reply.checkpoint.state != "unchanged":
        # The JSON is for scripts; a person running this wants the one line that matters.
        print(f"checkpoint {reply.checkpoint.state}: {reply.checkpoint.detail}", file=sys.stderr)
    return 0


def probe_arguments(p: argparse.ArgumentParser) -> None:
    add_cache_args(p, required=True)
    RANKS.add_to(p, default=[0])
    GPUS_FILE.add_to(p, help="also require each rank's GPU to be booked by the running GPU holder (its grant file)")


def probe(args: argparse.Namespace) -> int:
    from .daemon.probe import probe as check

    problems = check(args.socket_dir, args.name, args.ranks, gpus_file=args.gpus_file)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


def plan_arguments(p: argparse.ArgumentParser) -> None:
    add_plan_arguments(p)


def plan(args: argparse.Namespace) -> int:
    from .checkpoints.planner import plan_world, render

    world = plan_world(
        args.model,
        args.tp_size,
        args.pp_size,
        args.ep_size,
        quantization=args.quantization,
        weight_block_size=args.weight_block_size,
        dtype=args.dtype,
    )
    if args.verdict:
        return plan_verdict(args, world)
    print(json.dumps(world.to_json(), indent=2) if args.json else render(world))
    return 0 if world.ok else 1


def plan_verdict(args: argparse.Namespace, world: Any) -> int:
    """``plan --verdict``: refusals raise (exit 2, the message as the termination message); a plan
    that fits leaves its summary there instead, for the operator's status."""
    from weightcache_contract import termination

    from .checkpoints.planner import MemoryLimit, verdict
    from .gpu.device_memory import gpu_memory, host_memory, nvml_gpu_uuids

    limit, why = None, "not checked (no --fit)"
    if args.fit == "gpu":
        # The largest GPU here: a rank that exceeds it fits on none of them. A CUDA context's few
        # hundred MiB are not counted, so a rank this close to the limit is not refused here.
        try:
            gpus = [gpu_memory(uuid) for uuid in nvml_gpu_uuids()]
        except OSError as error:
            gpus, why = [], f"no GPU memory known: {error}"
        else:
            errors = [m.error for m in gpus if m.error]
            why = f"no GPU memory known: {errors[0] if errors else 'NVML lists no GPU here'}"
        totals = [m.total_bytes for m in gpus if m.total_bytes is not None]
        if totals:
            limit = MemoryLimit(max(totals), f"the largest of this node's {len(totals)} GPUs", per_rank=True)
    elif args.fit == "host":
        host = host_memory()
        candidates = []
        if host.total_bytes is not None:
            candidates.append(MemoryLimit(host.total_bytes, "the node's RAM (MemTotal)", per_rank=False))
        if args.memory_limit is not None:
            limit_what = "the daemon container's memory limit (spec.daemon.resources.limits.memory)"
            candidates.append(MemoryLimit(args.memory_limit, limit_what, per_rank=False))
        limit = min(candidates, key=lambda m: m.bytes, default=None)
        why = host.error or why
    local = args.ranks if args.ranks is not None else [r.rank for r in world.ranks]
    summary = verdict(world, local, limit, why)
    text = summary.model_dump_json(exclude_none=True)
    termination.write(text)
    print(text)
    return 0


def gen_checkpoint_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("out")
    g.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3", "qwen3_moe"])
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--intermediate-size", type=int, default=352)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--kv-heads", type=int, default=4)
    g.add_argument("--vocab-size", type=int, default=1024)
    DTYPE.add_to(g, default="bfloat16", help="the dtype the checkpoint's tensors are written in")
    g.add_argument("--shards", type=int, default=3)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tie-embeddings", action="store_true")
    g.add_argument("--fp8", action="store_true", help="store block-wise FP8 weights (a pre-quantized checkpoint)")
    g.add_argument(
        "--sparse",
        action="store_true",
        help="headers only, tensor bytes left as holes: any size for `weightcache plan`, not for loading",
    )
    g.add_argument("--experts", type=int, default=8, help="qwen3_moe: experts per layer")
    g.add_argument("--experts-per-token", type=int, default=2, help="qwen3_moe: experts routed per token (top-k)")
    g.add_argument("--moe-intermediate-size", type=int, default=128, help="qwen3_moe: each expert's MLP width")


def gen_checkpoint(args: argparse.Namespace) -> int:
    from .tools.sample_checkpoints import ModelSpec, write_checkpoint, write_sparse_checkpoint

    spec = ModelSpec(
        family=args.family,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_layers=args.layers,
        num_heads=args.heads,
        num_kv_heads=args.kv_heads,
        vocab_size=args.vocab_size,
        dtype=args.dtype,
        shards=args.shards,
        seed=args.seed,
        tie_word_embeddings=args.tie_embeddings,
        fp8=args.fp8,
        num_experts=args.experts,
        num_experts_per_tok=args.experts_per_token,
        moe_intermediate_size=args.moe_intermediate_size,
    )
    print(write_sparse_checkpoint(args.out, spec) if args.sparse else write_checkpoint(args.out, spec))
    return 0


def hf_generate_arguments(h: argparse.ArgumentParser) -> None:
    add_model_args(h)
    add_cache_args(h, required=False)
    h.add_argument("--weights", choices=["off", "client"], default="client")
    h.add_argument("--access", choices=["read-only", "read-write"], default="read-only")
    h.add_argument("--fallback", choices=["disk", "error"], default="disk")
    h.add_argument("--prompt", default="Hello")
    h.add_argument("--max-new-tokens", type=int, default=16)


def hf_generate(args: argparse.Namespace) -> int:
    from .checkpoints.checkpoint import open_checkpoint
    from .checkpoints.pipeline import resolve_dtype
    from .checkpoints.sharding import Layout
    from .client.weights import Weights, load_weights
    from .tools.reference_hf import dump, generate_report

    def load() -> Weights:
        return load_weights(
            args.model,
            Layout(),
            socket_dir=args.socket_dir if args.weights == "client" else None,
            name=args.name if args.weights == "client" else None,
            fallback=args.fallback,
            dtype=args.dtype,
            quantization=args.quantization,
            weight_block_size=args.weight_block_size,
            revision=args.revision,
            backend=args.backend,
            device=args.device,
            access=args.access,
        )

    dtype = resolve_dtype(args.dtype, open_checkpoint(args.model))
    print(dump(generate_report(args.model, load, dtype, args.prompt, args.max_new_tokens, args.started)))
    return 0


def demo_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("--workdir", default=None)
    m.add_argument("--max-new-tokens", type=int, default=16)


def demo(args: argparse.Namespace) -> int:
    from .tools.demo import default_workdir, run

    return run(args.workdir or default_workdir(), args.max_new_tokens)
