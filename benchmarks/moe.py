"""Qwen3-MoE benchmark: a block-FP8 mixture-of-experts checkpoint through the daemon and the engine.

On one GPU (or the CPU with ``--small``) it generates a pre-quantized Qwen3-MoE-shaped checkpoint
(Hub layout: one tensor per expert and projection, FP8 weights with 128×128-block scales; kept
in ``--workdir`` between runs), then measures

- safetensors loading the checkpoint onto the device, cold and warm page cache;
- the daemon's first load (cold page cache), which stacks each layer's experts into one
  gate_up and one down tensor as it reads;
- map + bind in fresh engine processes: connect, fingerprint check, map the arena, build the
  reference engine's model over the views (zero copy, checked) — target ≤ 25 ms;
- the engine's agreement with transformers' Qwen3-MoE in bfloat16 on the same device, fed the
  same weights dequantized: first token, greedy tokens equal before the two runs part, max logit
  difference; with transformers' own bf16 against its float32 as the baseline: with top-k routing
  a one-ulp bf16 difference can send a token to another expert, so two bf16 runs part ways about
  as soon as bf16 and float32 do, and only a gap well beyond the baseline points at the engine.

It prints one table at the end (progress goes to stderr) and asserts nothing. Full size: Qwen3-30B-A3B's shapes (hidden 2048, 128
experts of width 768, top 8, 32 heads, 4 KV heads) with 28 of its 48 layers: 16.5 GiB.

    PYTHONPATH=contract:daemon_image python benchmarks/moe.py                 # one GPU, about 3-4 minutes
    PYTHONPATH=contract:daemon_image python benchmarks/moe.py --small         # CPU, tiny, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from weightcache.checkpoints.page_cache import drop_page_cache
from weightcache.tools.bench import _checkpoint, _Daemon, _safetensors_load, _table
from weightcache.tools.sample_checkpoints import ModelSpec

PROMPT = [3, 17, 101, 7, 250, 42, 9, 300, 12, 5, 77, 1000, 64, 8, 31, 600]
BLOCK = (128, 128)


def spec(small: bool, layers: int | None, experts: int | None) -> ModelSpec:
    if small:
        return ModelSpec(
            family="qwen3_moe",
            hidden_size=256,
            intermediate_size=512,
            num_layers=layers or 2,
            num_heads=4,
            num_kv_heads=2,
            vocab_size=1024,
            num_experts=experts or 8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            fp8=True,
            shards=2,
            seed=7,
            tokenizer=False,
        )
    return ModelSpec(
        family="qwen3_moe",
        hidden_size=2048,
        intermediate_size=6144,
        num_layers=layers or 28,
        num_heads=32,
        num_kv_heads=4,
        vocab_size=32768,
        num_experts=experts or 128,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        fp8=True,
        shards=17,
        seed=7,
        tokenizer=False,
    )


def child(model_dir: str, socket_dir: str, name: str, backend: str) -> None:
    """One fresh engine process: CUDA context first (an engine has it before loading), then time
    fingerprint, map, and binding into the reference engine's model."""
    t0 = time.perf_counter()
    import torch
    from weightcache.checkpoints.sharding import Layout
    from weightcache.client.weights import expect, map_weights
    from weightcache.engine.config import ModelConfig
    from weightcache.engine.model import Model
    from weightcache.engine.parallel import Group

    if backend != "cpu-shm":
        torch.empty(1, device="cuda")
    cfg = ModelConfig.from_checkpoint(model_dir)
    imported = time.perf_counter()
    expected = expect(model_dir, Layout(), dtype="bfloat16", quantization="fp8", backend=backend)
    fingerprinted = time.perf_counter()
    weights = map_weights(expected, socket_dir, name)
    mapped = time.perf_counter()
    model = Model(cfg, weights.tensors, weights.aliases, Group(), BLOCK)
    bound = time.perf_counter()
    lo, hi = weights.arena.address_range if weights.arena is not None else (0, 0)
    print(
        json.dumps(
            {
                "imports": imported - t0,
                "fingerprint": fingerprinted - imported,
                "map": mapped - fingerprinted,
                "bind": bound - mapped,
                "map_bind": bound - fingerprinted,
                "tensors": len(weights.tensors),
                "in_arena": all(lo <= t.data_ptr() < hi for _, t in model.weights()),
            }
        )
    )


def agreement(model_dir: Path, socket_dir: str, name: str, backend: str, steps: int) -> dict[str, object]:
    """Engine (FP8 kernels, bf16 activations) vs transformers on the dequantized weights, in bf16 and,
    as the yardstick of what bf16 itself costs, in float32."""
    import torch
    from weightcache.checkpoints.sharding import Layout
    from weightcache.client.weights import expect, map_weights
    from weightcache.engine.config import ModelConfig
    from weightcache.engine.model import Model
    from weightcache.engine.parallel import Group
    from weightcache.tools.reference_hf import dequantized_hf_model

    weights = map_weights(
        expect(str(model_dir), Layout(), dtype="bfloat16", quantization="fp8", backend=backend), socket_dir, name
    )
    engine = Model(ModelConfig.from_checkpoint(model_dir), weights.tensors, weights.aliases, Group(), BLOCK)
    cache = engine.new_cache(len(PROMPT) + steps)
    started = time.perf_counter()
    logits = engine.forward(torch.tensor(PROMPT), cache)
    first_engine = logits[-1]
    ours = []
    for _ in range(steps):
        ours.append(int(logits[-1].argmax()))
        logits = engine.forward(torch.tensor(ours[-1:]), cache)
    engine_s = time.perf_counter() - started

    def reference(dtype: str) -> tuple[torch.Tensor, list[int]]:
        model = dequantized_hf_model(model_dir, weights, dtype, BLOCK)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([PROMPT], device=engine.device), use_cache=True)
            first = out.logits[0, -1].float()
            tokens = []
            for _ in range(steps):
                tokens.append(int(out.logits[0, -1].argmax()))
                out = model(
                    input_ids=torch.tensor([[tokens[-1]]], device=engine.device), cache=out.cache, use_cache=True
                )
        del model, out
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()  # the float32 copy comes next and is twice the size
        return first, tokens

    first_bf16, bf16 = reference("bfloat16")
    first_f32, f32 = reference("float32")
    top2 = first_bf16.topk(2).values
    return {
        "first": (ours[0], bf16[0], f32[0]),
        "steps": steps,
        "engine_decode_s": engine_s,
        "greedy": (prefix(ours, bf16), prefix(bf16, f32), prefix(ours, f32)),
        "dlogit": (
            float((first_engine - first_bf16).abs().max()),
            float((first_bf16 - first_f32).abs().max()),
            float((first_engine - first_f32).abs().max()),
        ),
        "margin": float(top2[0] - top2[1]),
    }


def prefix(a: list[int], b: list[int]) -> int:
    """How many greedy tokens two runs share before they part (after that they continue different texts)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="a tiny checkpoint, for a CPU smoke run")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--experts", type=int, default=None)
    p.add_argument("--backend", default=None, help="default: cuda-vmm with a GPU, else cpu-shm")
    p.add_argument("--runs", type=int, default=5, help="fresh engine processes for map+bind")
    p.add_argument("--steps", type=int, default=8, help="greedy tokens compared with transformers")
    p.add_argument("--load-workers", type=int, default=8)
    p.add_argument("--workdir", default=None, help="where the checkpoint is generated and kept between runs")
    args = p.parse_args()

    import torch

    backend = args.backend or ("cuda-vmm" if torch.cuda.is_available() else "cpu-shm")
    device = "cpu" if backend == "cpu-shm" else "cuda:0"
    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-moe-bench"))
    model_spec = spec(args.small, args.layers, args.experts)
    started = time.perf_counter()
    path = _checkpoint(workdir, model_spec, "cpu" if device == "cpu" else "cuda")
    made = time.perf_counter() - started
    shards = sorted(path.glob("*.safetensors"))
    gib = sum(s.stat().st_size for s in shards) / 2**30
    tensors = len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"])
    rows = [
        (
            "checkpoint",
            f"{gib:.2f} GiB block-FP8, {tensors} tensors in {len(shards)} shards, "
            f"{model_spec.num_layers} layers × {model_spec.num_experts} experts "
            f"(top {model_spec.num_experts_per_tok}); generated or found in {made:.1f} s",
        ),
        ("device", torch.cuda.get_device_name(0) if device != "cpu" else "cpu"),
    ]
    try:
        measure(rows, path, gib, device, backend, workdir, args)
    finally:
        _table(rows)  # once, at the end; whatever was measured before a failure is printed too
    return 0


def measure(
    rows: list[tuple[str, str]],
    path: Path,
    gib: float,
    device: str,
    backend: str,
    workdir: Path,
    args: argparse.Namespace,
) -> None:
    import torch

    cold = _safetensors_load(path, cold=True, device=device)
    warm = _safetensors_load(path, cold=False, device=device)
    if device != "cpu":
        torch.cuda.empty_cache()  # what safetensors loaded is garbage now; give the daemon its memory back
    rows += [
        (f"safetensors → {device}, cold page cache", f"{cold:.3f} s  ({gib / cold:.2f} GiB/s)"),
        (f"safetensors → {device}, warm page cache", f"{warm:.3f} s  ({gib / warm:.2f} GiB/s)"),
    ]
    print("safetensors done; starting the daemon", file=sys.stderr, flush=True)

    socket_dir = str(workdir / "sockets")
    drop_page_cache(path)
    daemon = _Daemon(path, socket_dir, "moe", backend, "fp8", args.load_workers)
    try:
        wall = daemon.wait_ready()
        ready = daemon.files.read_ready()
        assert ready is not None
        rows.append(
            (
                f"[{backend}] daemon first load, cold",
                f"{ready.load_seconds:.3f} s loading "
                f"({gib / ready.load_seconds:.2f} GiB/s, {cold / ready.load_seconds:.2f}× safetensors cold); "
                f"{wall:.3f} s to ready",
            )
        )
        print("daemon ready; map+bind in fresh engine processes", file=sys.stderr, flush=True)
        runs = []
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(path), socket_dir, "moe", backend],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                raise RuntimeError(f"engine process failed:\n{out.stderr}")
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        map_bind = [r["map_bind"] for r in runs]
        rows += [
            (
                f"[{backend}] engine fingerprint (median)",
                f"{statistics.median(r['fingerprint'] for r in runs) * 1e3:.1f} ms",
            ),
            (
                f"[{backend}] map+bind, {runs[0]['tensors']} arena tensors (median / max of {len(runs)})",
                f"{statistics.median(map_bind) * 1e3:.1f} ms / {max(map_bind) * 1e3:.1f} ms (target ≤ 25 ms; "
                f"map {statistics.median(r['map'] for r in runs) * 1e3:.1f}, "
                f"bind {statistics.median(r['bind'] for r in runs) * 1e3:.1f}); "
                f"every weight in the arena: {all(r['in_arena'] for r in runs)}",
            ),
        ]
        print("map+bind done; engine vs transformers", file=sys.stderr, flush=True)
        agree = agreement(path, socket_dir, "moe", backend, args.steps)
    finally:
        daemon.stop()
    engine, bf16, f32 = agree["first"]
    n = agree["steps"]
    rows += [
        (
            "first token: engine bf16 / transformers bf16 / transformers float32",
            f"{engine} / {bf16} / {f32}; transformers' bf16 top-2 margin {agree['margin']:.4f}",
        ),
        (
            f"greedy tokens equal before the runs part (of {n})",
            "engine bf16 vs transformers bf16: {}; baseline, transformers bf16 vs its float32: {}; "
            "engine bf16 vs transformers float32: {}".format(*agree["greedy"]),
        ),
        (
            "prompt's last-position max |Δlogit|",
            "engine bf16 vs transformers bf16: {:.4f}; baseline, transformers bf16 vs its float32: {:.4f}; "
            "engine bf16 vs transformers float32: {:.4f}".format(*agree["dlogit"]),
        ),
        ("engine decode", f"{agree['engine_decode_s']:.2f} s for the prompt and {n} tokens"),
    ]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:])
    else:
        sys.exit(main())
