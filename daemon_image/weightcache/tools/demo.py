"""The quick-start demo: one command that shows what weightcache is for, on CPU.

Generates a small real checkpoint, starts a daemon that loads it once, then starts an engine
process twice — once loading from disk, once mapping from the daemon — and prints both load
times, the speed-up and the greedy completion from each (which must be identical).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from weightcache_contract.errors import WeightCacheError

from ..checkpoints.page_cache import drop_page_cache
from ..wire.rankfiles import RankFiles
from .sample_checkpoints import ModelSpec, write_checkpoint

DEMO_SPEC = ModelSpec(
    family="llama",
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=12,
    num_heads=16,
    num_kv_heads=8,
    vocab_size=8192,
    shards=4,
    seed=1,
)
PROMPT = "The weight cache keeps"


def ensure_checkpoint(path: Path, spec: ModelSpec) -> Path:
    stamp = path / "weightcache-sample.json"
    if stamp.exists() and json.loads(stamp.read_text()) == asdict(spec):
        return path
    print(f"generating a {spec.family} checkpoint in {path} ...", flush=True)
    return write_checkpoint(path, spec)


def wait_ready(files: RankFiles, daemon: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not files.ready.exists():
        if daemon.poll() is not None:
            raise WeightCacheError(f"daemon exited with code {daemon.returncode} before becoming ready")
        if time.monotonic() > deadline:
            raise WeightCacheError(f"daemon not ready after {timeout_s:.0f} s")
        time.sleep(0.05)


def run_engine(args: list[str]) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "weightcache", "hf-generate", *args], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise WeightCacheError(f"engine failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["wall_seconds"] = time.perf_counter() - started
    return report


def run(workdir: str, max_new_tokens: int = 16) -> int:
    root = Path(workdir)
    checkpoint = ensure_checkpoint(root / "checkpoint", DEMO_SPEC)
    socket_dir = str(root / "sockets")
    name = "demo"
    files = RankFiles(socket_dir, name, 0)
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "weightcache",
            "daemon",
            "--model",
            str(checkpoint),
            "--socket-dir",
            socket_dir,
            "--name",
            name,
            "--dtype",
            "bfloat16",
        ]
    )
    try:
        wait_ready(files, daemon, timeout_s=600)
        ready = files.read_ready()
        common = [
            "--model",
            str(checkpoint),
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            str(max_new_tokens),
            "--dtype",
            "bfloat16",
        ]
        dropped = drop_page_cache(checkpoint)
        disk = run_engine([*common, "--weights", "off"])
        cached = run_engine(
            [*common, "--weights", "client", "--socket-dir", socket_dir, "--name", name, "--fallback", "error"]
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)

    gib = (ready.arena_bytes if ready else 0) / 2**30
    print()
    print(f"checkpoint: {checkpoint} ({gib:.2f} GiB of weights, {ready.tensor_count if ready else '?'} tensors)")
    print(f"daemon first load (disk → arena): {ready.load_seconds if ready else float('nan'):.3f} s")
    print()
    print(f"{'engine start':<26} {'weights ready':>14} {'process':>9}  completion")
    for label, r in ((f"from disk{' (cold cache)' if dropped else ''}", disk), ("from the weight cache", cached)):
        print(
            f"{label:<26} {r['weights_ready_seconds'] * 1000:>11.1f} ms {r['process_seconds']:>7.2f} s  {r['completion']!r}"
        )
    speedup = disk["weights_ready_seconds"] / max(cached["weights_ready_seconds"], 1e-9)
    print()
    print(
        f"speed-up of weight loading: {speedup:.0f}×  (mapped {cached['bytes_mapped'] / 2**20:.0f} MiB, "
        f"zero copies; disk path read {disk['bytes_loaded'] / 2**20:.0f} MiB)"
    )
    same = disk["tokens"] == cached["tokens"]
    print(f"greedy completions identical: {'yes' if same else 'NO'}")
    print(f"daemon stopped cleanly: {'yes' if daemon.returncode == 0 else f'NO (exit {daemon.returncode})'}")
    return 0 if same and daemon.returncode == 0 else 1


def default_workdir() -> str:
    return os.path.join(os.environ.get("WEIGHTCACHE_CACHE", os.path.expanduser("~/.cache/weightcache")), "demo")
