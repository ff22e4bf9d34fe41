"""``weightcache bench``: disk load vs daemon load vs map+bind, on a generated checkpoint.

Prints a table; it asserts nothing. Map+bind runs in fresh engine processes (the way an engine
restart sees it): connect, hello, query the fingerprint, fetch manifest + fd, map read-only,
create the views and bind them into a transformers model built on the meta device. The model
skeleton is built before the clock starts; the fingerprint (which reads shard headers) is timed
separately because an engine computes it once per start, not per tensor.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from .page_cache import drop_page_cache
from .rankfiles import RankFiles
from .sample_checkpoints import ModelSpec, write_checkpoint

TENSORS_PER_LAYER = 9  # q, k, v, o, gate, up, down, two norms (Llama)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--size-gib", type=float, default=4.0, help="approximate checkpoint size")
    p.add_argument("--tensors", type=int, default=2000, help="approximate tensor count")
    p.add_argument("--runs", type=int, default=5, help="fresh engine processes for map+bind")
    p.add_argument("--workdir", default=None, help="where checkpoints are generated and kept between runs")


def spec_for(size_gib: float, tensors: int) -> ModelSpec:
    """A Llama shape with about this many tensors and bytes (bf16, MLP 2.75× hidden, GQA 2:1)."""
    layers = max(1, (tensors - 3) // TENSORS_PER_LAYER)
    vocab = 4096
    # bytes ≈ 2 · (layers · (3h² + 3 · 2.75h²) + 2 · vocab · h); solve the quadratic for h.
    a, b, c = 2 * layers * (3 + 8.25), 2 * 2 * vocab, -size_gib * 2**30
    hidden = (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    hidden = max(64, int(hidden // 64 * 64))
    inter = int(hidden * 2.75 // 64 * 64)
    return ModelSpec(family="llama", hidden_size=hidden, intermediate_size=inter, num_layers=layers,
                     num_heads=hidden // 64, num_kv_heads=max(1, hidden // 128), vocab_size=vocab,
                     shards=max(1, int(size_gib * 2)), seed=7, tokenizer=False)


def _checkpoint(workdir: Path, spec: ModelSpec) -> Path:
    path = workdir / f"ckpt-h{spec.hidden_size}-l{spec.num_layers}"
    stamp = path / "weightcache-sample.json"
    if not (stamp.exists() and json.loads(stamp.read_text()) == asdict(spec)):
        print(f"generating {path} ...", flush=True)
        write_checkpoint(path, spec)
    return path


def _disk_load(path: Path, cold: bool) -> float:
    """safetensors → private memory, as an engine loading its parameters does.

    ``load_file`` may hand back tensors over a lazy mmap of the file; copying each into its own
    allocation forces every byte to be read, which is what loading means.
    """
    from safetensors import safe_open

    if cold:
        drop_page_cache(path)
    started = time.perf_counter()
    for shard in sorted(path.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                torch.empty_like(tensor).copy_(tensor)
    return time.perf_counter() - started


def _child(argv: list[str]) -> None:
    """One fresh engine process: build the skeleton, then time map+bind."""
    model_dir, socket_dir, name = argv
    t0 = time.perf_counter()
    from .binding import bind
    from .client import expect, map_weights
    from .reference_hf import empty_hf_model
    from .sharding import Layout

    imported = time.perf_counter()
    expected = expect(model_dir, Layout(), dtype="bfloat16")
    fingerprinted = time.perf_counter()
    model = empty_hf_model(model_dir, "bfloat16")
    started = time.perf_counter()
    weights = map_weights(expected, socket_dir, name)
    mapped = time.perf_counter()
    bind(model, weights.tensors, weights.aliases)
    bound = time.perf_counter()
    print(json.dumps({"imports": imported - t0, "fingerprint": fingerprinted - imported, "map": mapped - started,
                      "bind": bound - mapped, "map_bind": bound - started, "tensors": len(weights.tensors)}))


def run(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench"))
    spec = spec_for(args.size_gib, args.tensors)
    path = _checkpoint(workdir, spec)
    size = sum(p.stat().st_size for p in path.glob("*.safetensors"))
    cold = _disk_load(path, cold=True)
    warm = _disk_load(path, cold=False)

    socket_dir = str(workdir / "sockets")
    name = "bench"
    files = RankFiles(socket_dir, name, 0)
    drop_page_cache(path)
    started = time.perf_counter()
    daemon = subprocess.Popen([sys.executable, "-m", "weightcache", "--log-level", "warning", "daemon",
                               "--model", str(path), "--socket-dir", socket_dir, "--name", name, "--dtype", "bfloat16"])
    try:
        while not files.ready.exists():
            if daemon.poll() is not None:
                print(f"daemon exited with {daemon.returncode}", file=sys.stderr)
                return 1
            time.sleep(0.01)
        daemon_wall = time.perf_counter() - started
        ready = files.read_ready()
        assert ready is not None
        runs = []
        for _ in range(args.runs):
            out = subprocess.run([sys.executable, "-m", "weightcache.bench", str(path), socket_dir, name],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)

    map_bind = [r["map_bind"] for r in runs]
    median = statistics.median(map_bind)
    gib = size / 2**30
    rows = [
        ("checkpoint", f"{gib:.2f} GiB, {runs[0]['tensors']} tensors, {len(list(path.glob('*.safetensors')))} shards"),
        ("disk load, cold page cache (safetensors → memory)", f"{cold:.3f} s  ({gib / cold:.2f} GiB/s)"),
        ("disk load, warm page cache", f"{warm:.3f} s  ({gib / warm:.2f} GiB/s)"),
        ("daemon first load, cold (ready file written)", f"{daemon_wall:.3f} s wall, {ready.load_seconds:.3f} s loading"),
        ("engine fingerprint (headers, median)", f"{statistics.median(r['fingerprint'] for r in runs) * 1000:.1f} ms"),
        (f"engine map+bind (median / max of {len(runs)})", f"{median * 1000:.1f} ms / {max(map_bind) * 1000:.1f} ms"),
        ("  of which map (connect, fetch, mmap, views)", f"{statistics.median(r['map'] for r in runs) * 1000:.1f} ms"),
        ("  of which bind into the model", f"{statistics.median(r['bind'] for r in runs) * 1000:.1f} ms"),
        ("speed-up vs cold disk / warm disk", f"{cold / median:.0f}× / {warm / median:.0f}×"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    _child(sys.argv[1:])
