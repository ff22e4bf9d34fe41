"""``weightcache bench``: disk vs daemon load vs map+bind vs keeper re-adoption, on a generated checkpoint.

Prints a table; it asserts nothing. Map+bind runs in fresh engine processes (the way an engine
restart sees it): connect, hello, query the fingerprint, fetch manifest + fd (or IPC handle), map,
and bind — into the reference engine (names and shapes checked, each layer's views made on its
first use, so its first forward is timed as well, with the materialisation inside it) and into a
transformers model built on the meta device (every view and Parameter made at bind; see
``_child``). The model skeleton and the config are read before the clock starts; the fingerprint
(which stats the shards) is timed separately because an engine computes it once per start, not
per tensor. With a GPU backend the
disk baselines load onto the GPU (safetensors ``device="cuda:0"``), as an engine would.

``--synthetic`` measures ranks larger than the disk, for several cases in one run (``--cases``):
each checkpoint is sparse (``sample_checkpoints.write_sparse_checkpoint``: real config, index
and headers, tensor bytes as holes) and the daemon fills its arena with a byte pattern
(``--synthetic-fill``) instead of reading. Planning, allocation, the manifest, serving, mapping,
binding and re-adoption are the real code paths; disk and first-load figures are not measured,
and every row of the table says SYNTHETIC.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from weightcache_contract.launch import LOAD_WORKERS_OPTION, DaemonArgs, KeeperArgs

from ..checkpoints.page_cache import drop_page_cache
from ..wire.rankfiles import RankFiles

if TYPE_CHECKING:
    from .sample_checkpoints import ModelSpec

TENSORS_PER_LAYER = 9  # q, k, v, o, gate, up, down, two norms (Llama)
MOE_TENSORS_PER_LAYER = 9  # q, k, v, o, q_norm, k_norm, two norms, router (Qwen3-MoE); + 3 per expert
READ_CHUNK = 64 * 2**20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-gib", type=float, default=4.0, help="approximate size of the bf16 weights")
    p.add_argument("--tensors", type=int, default=2000, help="approximate tensor count (bf16 layout)")
    p.add_argument("--fp8", action="store_true", help="a pre-quantized block-FP8 checkpoint of the same shapes")
    p.add_argument("--backends", default=None, help="comma list; default cuda-vmm,cuda-ipc with a GPU, else cpu-shm")
    p.add_argument("--runs", type=int, default=5, help="fresh engine processes for map+bind")
    p.add_argument("--workdir", default=None, help="where checkpoints are generated and kept between runs")
    LOAD_WORKERS_OPTION.add_to(p, default=8, help="daemon loader threads")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="sparse checkpoints + arenas filled with a byte pattern, for ranks larger than the disk: "
        "map+bind and keeper re-adoption of every case in --cases, at --size-gib each",
    )
    p.add_argument(
        "--cases",
        default="dense:5000,dense:20000,moe:100000",
        help="--synthetic only: comma list of dense:TENSORS (Llama shape) or moe:TENSORS (Qwen3-MoE, one "
        "checkpoint tensor per expert and projection, as the Hub stores it)",
    )
    p.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help="what map+bind binds into, each in its own fresh processes: engine (the reference engine: "
        "names and shapes checked at bind, views made per layer on first use; its first forward is "
        "timed too) and/or transformers (every view and Parameter made at bind)",
    )


def spec_for(size_gib: float, tensors: int, fp8: bool = False) -> ModelSpec:
    """A Llama shape with about this many tensors and bf16 bytes (MLP 2.75× hidden, GQA 2:1)."""
    from .sample_checkpoints import ModelSpec  # imports torch: not at parser-building time

    layers = max(1, (tensors - 3) // TENSORS_PER_LAYER)
    vocab = 4096
    # bytes ≈ 2 · (layers · (3h² + 3 · 2.75h²) + 2 · vocab · h); solve the quadratic for h.
    a, b, c = 2 * layers * (3 + 8.25), 2 * 2 * vocab, -size_gib * 2**30
    hidden = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    hidden = max(128, int(hidden // 128 * 128))
    inter = max(128, int(hidden * 2.75 // 128 * 128))
    return ModelSpec(
        family="llama",
        hidden_size=hidden,
        intermediate_size=inter,
        num_layers=layers,
        num_heads=hidden // 64,
        num_kv_heads=max(1, hidden // 128),
        vocab_size=vocab,
        shards=max(1, int(size_gib * 2)),
        seed=7,
        tokenizer=False,
        fp8=fp8,
    )


def moe_spec_for(size_gib: float, tensors: int) -> ModelSpec:
    """A Qwen3-MoE shape with about this many checkpoint tensors, experts carrying nearly all the
    bytes: 48 layers (64 beyond 20,000 tensors), experts to reach the count, the expert width to
    reach the size; head dim 128, 4 KV heads, hidden 4096 up to 64 experts and 2048 beyond."""
    from .sample_checkpoints import ModelSpec

    layers = 48 if tensors <= 21_000 else 64
    experts = max(2, round((tensors / layers - MOE_TENSORS_PER_LAYER) / 3))
    hidden = 4096 if experts <= 64 else 2048
    vocab = 4096
    heads, kv_heads = hidden // 128, 4
    attention = layers * (2 * hidden * hidden + 2 * kv_heads * 128 * hidden) * 2
    rest = size_gib * 2**30 - attention - 2 * vocab * hidden * 2
    inter = max(16, int(rest / (layers * experts * 3 * hidden * 2)) // 16 * 16)
    return ModelSpec(
        family="qwen3_moe",
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        vocab_size=vocab,
        seed=7,
        tokenizer=False,
        num_experts=experts,
        num_experts_per_tok=min(8, experts),
        moe_intermediate_size=inter,
    )


def _sparse(workdir: Path, spec: ModelSpec) -> Path:
    from .sample_checkpoints import write_sparse_checkpoint

    path = workdir / f"sparse-{hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]}"
    stamp = path / "weightcache-sample.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == {**asdict(spec), "sparse": True}):
        print(f"writing the sparse checkpoint {path} (headers only, tensor bytes as holes) ...", flush=True)
        write_sparse_checkpoint(path, spec)
        stamp.write_text(json.dumps({**asdict(spec), "sparse": True}))
    return path


def _checkpoint(workdir: Path, spec: ModelSpec, device: str) -> Path:
    from .sample_checkpoints import write_checkpoint

    path = workdir / f"ckpt-h{spec.hidden_size}-l{spec.num_layers}{'-fp8' if spec.fp8 else ''}"
    stamp = path / "weightcache-sample.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == asdict(spec)):
        print(f"generating {path} ...", flush=True)
        write_checkpoint(path, spec, device=device)
    return path


def _raw_read(path: Path) -> float:
    """Sequential read of every shard after dropping the page cache: what the disk can give."""
    drop_page_cache(path)
    buf = bytearray(READ_CHUNK)
    view = memoryview(buf)
    started = time.perf_counter()
    for shard in sorted(path.glob("*.safetensors")):
        with shard.open("rb", buffering=0) as fh:
            while fh.readinto(view):
                pass
    return time.perf_counter() - started


def _safetensors_load(path: Path, cold: bool, device: str) -> float:
    """safetensors → the engine's memory (a private host copy, or the GPU)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file

    if cold:
        drop_page_cache(path)
    started = time.perf_counter()
    for shard in sorted(path.glob("*.safetensors")):
        if device == "cpu":
            # load_file may hand back tensors over a lazy mmap; copying forces every byte to be read.
            with safe_open(str(shard), framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    torch.empty_like(tensor).copy_(tensor)
        else:
            loaded = load_file(str(shard), device=device)
            torch.cuda.synchronize()
            loaded.clear()
    return time.perf_counter() - started


ENGINES = ("engine", "transformers")


def _child(argv: list[str]) -> None:
    """One fresh engine process: build what exists before weights, then time map+bind.

    ``engine`` is the reference engine (weightcache.engine): map+bind is everything it does before
    its first forward — connect, fetch, map, the lazy index, the model with every name and shape
    checked — and the first forward, timed on its own, makes the layers' views as it reaches them
    (``materialise`` is that part of it; a second forward shows the compute alone).
    ``transformers`` binds every tensor eagerly (one view and one Parameter each) into a model
    built on the meta device; transformers has no block-FP8 linear, so for FP8 it is map only.
    """
    model_dir, socket_dir, name, backend, quantization, revision, engine = argv
    t0 = time.perf_counter()
    import torch

    from ..checkpoints.sharding import Layout
    from ..client.binding import bind
    from ..client.weights import expect, map_weights
    from ..engine.config import ModelConfig
    from ..engine.model import Model
    from ..engine.parallel import Group
    from .reference_hf import empty_hf_model

    gpu = backend != "cpu-shm"
    if gpu:
        torch.cuda.init()  # type: ignore[no-untyped-call]
        torch.empty(1, device="cuda")  # an engine has its CUDA context before it loads weights
    imported = time.perf_counter()
    expected = expect(
        model_dir, Layout(), dtype="bfloat16", backend=backend, quantization=quantization, revision=revision
    )
    fingerprinted = time.perf_counter()
    skeleton = empty_hf_model(model_dir, "bfloat16") if engine == "transformers" and quantization != "fp8" else None
    cfg = ModelConfig.from_checkpoint(model_dir)
    started = time.perf_counter()
    weights = map_weights(expected, socket_dir, name)
    mapped = time.perf_counter()
    model = None
    if engine == "engine":
        model = Model(cfg, weights.tensors, weights.aliases, Group(), expected.quant.weight_block_size)
        model.keep_alive = weights
    elif skeleton is not None:
        bind(skeleton, weights.tensors, weights.aliases)
    bound = time.perf_counter()
    result = {
        "engine": engine,
        "imports": imported - t0,
        "fingerprint": fingerprinted - imported,
        "map": mapped - started,
        "bind": bound - mapped,
        "map_bind": bound - started,
        "tensors": len(weights.tensors),
        "views_at_bind": getattr(weights.tensors, "materialised", None),
    }
    if model is not None:
        forwards = []
        for _ in range(2):  # the first makes every layer's views, the second is compute alone
            cache = model.new_cache(1)
            begun = time.perf_counter()
            model.forward(torch.tensor([1]), cache)
            if gpu:
                torch.cuda.synchronize()
            forwards.append(time.perf_counter() - begun)
        result.update(first_forward=forwards[0], materialise=model.materialise_seconds, second_forward=forwards[1])
    print(json.dumps(result))


class _Daemon:
    def __init__(
        self,
        path: Path,
        socket_dir: str,
        name: str,
        backend: str,
        quantization: str,
        workers: int,
        synthetic: bool = False,
    ) -> None:
        self.files = RankFiles(socket_dir, name, 0)
        self.launched = time.time()
        self.started = time.perf_counter()
        daemon = DaemonArgs(
            model=str(path),
            name=name,
            socket_dir=socket_dir,
            backend=backend,
            dtype="bfloat16",
            quantization=quantization,
            load_workers=workers,
            synthetic_fill=synthetic,
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "weightcache", "--log-level", "warning", "daemon", *daemon.to_argv()]
        )

    def wait_ready(self) -> float:
        while True:
            info = self.files.read_ready()
            if info is not None and info.started_at >= self.launched:
                return time.perf_counter() - self.started
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}")
            time.sleep(0.005)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)


def run(args: argparse.Namespace) -> int:
    import torch

    gpu = torch.cuda.is_available()
    if args.synthetic:
        return _run_synthetic(args, gpu)
    engines = _engines(args)
    backends = (args.backends or ("cuda-vmm,cuda-ipc" if gpu else "cpu-shm")).split(",")
    device = "cuda:0" if backends[0] != "cpu-shm" else "cpu"
    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench"))
    spec = spec_for(args.size_gib, args.tensors, args.fp8)
    path = _checkpoint(workdir, spec, "cuda" if gpu else "cpu")
    quantization = "fp8" if args.fp8 else "none"
    size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    gib = size / 2**30
    raw = _raw_read(path)
    cold = _safetensors_load(path, cold=True, device=device)
    warm = _safetensors_load(path, cold=False, device=device)
    target = "GPU" if device != "cpu" else "memory"
    rows = [
        (
            "checkpoint",
            f"{gib:.2f} GiB on disk, {'block-fp8' if args.fp8 else 'bf16'}, "
            f"{len(list(path.glob('*.safetensors')))} shards",
        ),
        ("raw sequential read, cold", f"{raw:.3f} s  ({gib / raw:.2f} GiB/s)"),
        (f"safetensors → {target}, cold page cache", f"{cold:.3f} s  ({gib / cold:.2f} GiB/s)"),
        (f"safetensors → {target}, warm page cache", f"{warm:.3f} s  ({gib / warm:.2f} GiB/s)"),
    ]

    socket_dir = str(workdir / "sockets")
    for backend in backends:
        drop_page_cache(path)
        daemon = _Daemon(path, socket_dir, "bench", backend, quantization, args.load_workers)
        try:
            wall = daemon.wait_ready()
            ready = daemon.files.read_ready()
            assert ready is not None
            runs = {
                engine: [
                    _engine_run(path, socket_dir, "bench", backend, quantization, "", engine) for _ in range(args.runs)
                ]
                for engine in engines
            }
        finally:
            daemon.stop()
        _table(rows)  # partial results survive a run cut short
        first = next(iter(runs.values()))
        median = statistics.median(r["map_bind"] for r in first)
        rows += [
            (
                f"[{backend}] daemon first load, cold",
                f"{ready.load_seconds:.3f} s loading ({gib / ready.load_seconds:.2f} "
                f"GiB/s, {cold / ready.load_seconds:.2f}× safetensors cold); "
                f"{wall:.3f} s to ready",
            ),
            (
                f"[{backend}] engine fingerprint (median)",
                f"{statistics.median(r['fingerprint'] for r in first) * 1000:.1f} ms",
            ),
        ]
        for engine, engine_runs in runs.items():
            rows.append(
                (
                    f"[{backend}] map+bind, {engine_runs[0]['tensors']} tensors, {_LABEL[engine]} "
                    f"(median / max of {len(engine_runs)})",
                    f"{_ms(r['map_bind'] for r in engine_runs)}  {_split(engine_runs)}",
                )
            )
            if engine == "engine":
                rows.append(
                    (
                        f"[{backend}] first forward after map+bind, reference engine (median / max)",
                        _forwards(engine_runs),
                    )
                )
        rows.append(
            (
                f"[{backend}] speed-up vs safetensors cold / warm ({_LABEL[next(iter(runs))]})",
                f"{cold / median:.0f}× / {warm / median:.0f}×",
            )
        )
        if backend in ("cpu-shm", "cuda-vmm"):
            rows.append(
                (
                    f"[{backend}] keeper re-adoption after daemon SIGKILL",
                    _readopt(path, socket_dir, backend, quantization, args.load_workers),
                )
            )
    _table(rows)
    return 0


def _engine_run(
    path: Path, socket_dir: str, name: str, backend: str, quantization: str, revision: str, engine: str
) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "weightcache.tools.bench",
            str(path),
            socket_dir,
            name,
            backend,
            quantization,
            revision,
            engine,
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"engine process failed ({out.returncode}):\n{out.stderr[-4000:]}")
    run: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return run


_LABEL = {
    "engine": "reference engine, views made per layer on first use",
    "transformers": "transformers, every view and Parameter at bind",
}


def _engines(args: argparse.Namespace) -> list[str]:
    engines: list[str] = args.engines.split(",")
    if not engines or any(e not in ENGINES for e in engines):
        raise SystemExit(f"--engines: a comma list of {', '.join(ENGINES)}, got {args.engines!r}")
    return engines


def _ms(values: Iterable[float]) -> str:
    values = list(values)
    return f"{statistics.median(values) * 1000:.1f} / {max(values) * 1000:.1f} ms"


def _median_ms(runs: list[dict[str, Any]], key: str) -> str:
    return f"{statistics.median(r[key] for r in runs) * 1000:.1f}"


def _split(runs: list[dict[str, Any]]) -> str:
    """(map, bind) medians; ``views`` says how many tensor views existed when bind returned."""
    views, total = runs[0].get("views_at_bind"), runs[0]["tensors"]
    made = "" if views is None else f"; {views} of {total} views made"
    return f"(map {_median_ms(runs, 'map')}, bind {_median_ms(runs, 'bind')}{made})"


def _forwards(runs: list[dict[str, Any]]) -> str:
    """The first forward, the layers' materialisation inside it, and a second forward (compute alone)."""
    return (
        f"{_ms(r['first_forward'] for r in runs)}, of which materialising the layers' views "
        f"{_median_ms(runs, 'materialise')} ms; second forward {_median_ms(runs, 'second_forward')} ms"
    )


def _run_synthetic(args: argparse.Namespace, gpu: bool) -> int:
    """Every case of ``--cases`` at ``--size-gib``: daemon start, map+bind in fresh engine processes,
    then the daemon SIGKILLed and a new one re-adopting the arena from the keeper; one table."""
    from ..checkpoints.loader import SYNTHETIC_REVISION
    from ..client.weights import DaemonConnection
    from ..daemon.keeper import KeeperClient, keeper_socket

    backend = (args.backends or ("cuda-vmm" if gpu else "cpu-shm")).split(",")[0]
    if backend not in ("cpu-shm", "cuda-vmm"):
        raise SystemExit("--synthetic measures cpu-shm or cuda-vmm (the backends the keeper holds)")
    if args.fp8:
        raise SystemExit("--synthetic measures bf16 ranks; drop --fp8")
    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench"))
    socket_dir = str(workdir / "sockets")
    engines = _engines(args)
    header = (
        "SYNTHETIC case",
        "checkpoint tensors → arena tensors",
        "GiB",
        "daemon start→ready",
        "bound into",
        "map+bind median / max",
        "(map, bind; views made by then)",
        "first forward median / max (materialise, in it; 2nd forward)",
        "re-adopt: adopting, start→ready, disk bytes",
    )
    rows: list[tuple[str, ...]] = []
    print(
        f"SYNTHETIC [{backend}]: arenas hold a byte pattern, from sparse checkpoints (real headers, no data); "
        f"{args.runs} fresh engine processes per case; disk and first-load figures are not measured",
        flush=True,
    )
    keeper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weightcache",
            "--log-level",
            "warning",
            "keeper",
            *KeeperArgs(socket_dir=socket_dir).to_argv(),
        ]
    )
    try:
        while not keeper_socket(socket_dir).exists():
            if keeper.poll() is not None:
                raise RuntimeError(f"keeper exited with {keeper.returncode}")
            time.sleep(0.01)
        for case in args.cases.split(","):
            kind, _, count = case.partition(":")
            if kind not in ("dense", "moe") or not count.isdigit():
                raise SystemExit(f"--cases: {case!r} is not dense:TENSORS or moe:TENSORS")
            spec = moe_spec_for(args.size_gib, int(count)) if kind == "moe" else spec_for(args.size_gib, int(count))
            path = _sparse(workdir, spec)
            checkpoint_tensors = len(json.loads((path / "model.safetensors.index.json").read_text())["weight_map"])
            first = _Daemon(path, socket_dir, "bench", backend, "none", args.load_workers, synthetic=True)
            try:
                start_to_ready = first.wait_ready()
                ready = first.files.read_ready()
                assert ready is not None
                runs = {
                    engine: [
                        _engine_run(path, socket_dir, "bench", backend, "none", SYNTHETIC_REVISION, engine)
                        for _ in range(args.runs)
                    ]
                    for engine in engines
                }
                while True:  # the keeper holds the arena once the daemon deposited it
                    with DaemonConnection(first.files.socket) as conn:
                        if conn.status().deposited:
                            break
                    time.sleep(0.02)
            finally:
                first.stop(signal.SIGKILL)
            second = _Daemon(path, socket_dir, "bench", backend, "none", args.load_workers, synthetic=True)
            try:
                readopt_wall = second.wait_ready()
                info = second.files.read_ready()
                with DaemonConnection(second.files.socket) as conn:
                    disk = conn.status().disk_bytes_read
            finally:
                second.stop()
            with KeeperClient(keeper_socket(socket_dir)) as k:
                k.release("bench")  # frees the arena before the next case allocates its own
            assert info is not None
            shape = f"{spec.num_layers}L×{spec.num_experts}E" if kind == "moe" else f"{spec.num_layers}L"
            case_cells = (
                f"{kind} {shape} h{spec.hidden_size}",
                f"{checkpoint_tensors} → {ready.tensor_count}",
                f"{ready.arena_bytes / 2**30:.1f}",
                f"{start_to_ready:.2f} s",
            )
            readopt = (
                f"{info.load_seconds * 1000:.1f} ms, {readopt_wall:.2f} s, {disk}"
                f"{'' if info.adopted else ' (NOT ADOPTED)'}"
            )
            for i, (engine, engine_runs) in enumerate(runs.items()):
                forward = ""
                if engine == "engine":
                    forward = (
                        f"{_ms(r['first_forward'] for r in engine_runs)} ({_median_ms(engine_runs, 'materialise')};"
                        f" {_median_ms(engine_runs, 'second_forward')} ms)"
                    )
                views = engine_runs[0]["views_at_bind"]
                rows.append(
                    (
                        *(case_cells if i == 0 else ("",) * 4),
                        engine,
                        _ms(r["map_bind"] for r in engine_runs),
                        f"({_median_ms(engine_runs, 'map')}, {_median_ms(engine_runs, 'bind')}; {views})",
                        forward or "-",
                        readopt if i == 0 else "",
                    )
                )
            _grid(header, rows)  # partial results survive a run cut short
    finally:
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(timeout=60)
    return 0


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    print()
    for row in (header, *rows):
        print("  ".join(f"{cell:<{w}}" for cell, w in zip(row, widths)).rstrip(), flush=True)


def _table(rows: list[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}", flush=True)


def _readopt(path: Path, socket_dir: str, backend: str, quantization: str, workers: int) -> str:
    from ..client.weights import DaemonConnection
    from ..daemon.keeper import KeeperClient, keeper_socket

    keeper = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weightcache",
            "--log-level",
            "warning",
            "keeper",
            *KeeperArgs(socket_dir=socket_dir).to_argv(),
        ]
    )
    try:
        while not keeper_socket(socket_dir).exists():
            time.sleep(0.01)
        first = _Daemon(path, socket_dir, "readopt", backend, quantization, workers)
        first.wait_ready()
        while True:
            with DaemonConnection(first.files.socket) as conn:
                if conn.status().deposited:
                    break
            time.sleep(0.02)
        first.stop(signal.SIGKILL)
        second = _Daemon(path, socket_dir, "readopt", backend, quantization, workers)
        wall = second.wait_ready()
        info = second.files.read_ready()
        with DaemonConnection(second.files.socket) as conn:
            disk = conn.status().disk_bytes_read
        second.stop()
        with KeeperClient(keeper_socket(socket_dir)) as k:
            k.release("readopt")
        assert info is not None
        return (
            f"{info.load_seconds * 1000:.1f} ms adopting, {wall:.2f} s process start to ready, "
            f"adopted={info.adopted}, disk bytes read={disk}"
        )
    finally:
        keeper.send_signal(signal.SIGTERM)
        keeper.wait(timeout=30)


if __name__ == "__main__":
    _child(sys.argv[1:])
