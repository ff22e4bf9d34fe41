"""The quick-start demo: one command that shows what weightcache is for, on CPU.

Generates a small real checkpoint, starts a daemon that loads it once, then starts the reference
engine (``weightcache engine``) twice — once loading from disk, once mapping from the daemon —
and prints, for each, the weight phase, the time from process start to ``/ready`` and its phases
(from the engine's own startup timeline), and one greedy completion (which must be identical).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import DaemonArgs, EngineArgs

from ..checkpoints.page_cache import drop_page_cache
from ..engine.launcher import free_port
from ..engine.timeline import PHASES
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
ENGINE_TIMEOUT_S = 300.0


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


def http(port: int, path: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> tuple[int, str]:
    """GET (or, with a body, POST JSON) on the local engine; (status, text), 4xx/5xx included."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def startup_marks(metrics: str, rank: int = 0) -> dict[str, float]:
    """The engine's startup timeline from its ``/metrics``: phase → seconds since process start."""
    pattern = rf'weightcache_engine_startup_seconds\{{phase="(\w+)",rank="{rank}"\}} (\S+)'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, metrics)}


def run_engine(engine: EngineArgs, max_new_tokens: int, log: Path) -> dict[str, Any]:
    """Start ``weightcache engine`` with ``engine``'s flags, wait for ``/ready``, ask for one greedy
    completion, stop it with SIGTERM; returns what it reported."""
    port = free_port()
    argv = [sys.executable, "-m", "weightcache", "engine", *engine.but(port=port).to_argv()]
    started = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise WeightCacheError(f"engine exited {proc.returncode} before it was ready; see {log}")
            if time.perf_counter() - started > ENGINE_TIMEOUT_S:
                raise WeightCacheError(f"engine not ready after {ENGINE_TIMEOUT_S:.0f} s; see {log}")
            try:
                if http(port, "/ready", timeout=1)[0] == 200:
                    break
            except OSError:  # not listening yet
                pass
            time.sleep(0.01)
        ready_wall = time.perf_counter() - started
        request = {"prompt": PROMPT, "max_tokens": max_new_tokens, "temperature": 0, "return_token_ids": True}
        status, text = http(port, "/v1/completions", request)
        if status != 200:
            raise WeightCacheError(f"the engine answered {status}: {text}")
        answered = time.perf_counter() - started
        choice = json.loads(text)["choices"][0]
        weights = json.loads(http(port, "/health")[1])["ranks"][0]["weights"]
        marks = startup_marks(http(port, "/metrics")[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    return {
        **weights,
        "ready_wall": ready_wall,
        "answered_wall": answered,
        "marks": marks,
        "completion": choice["text"],
        "tokens": choice["token_ids"],
    }


def run(workdir: str, max_new_tokens: int = 16) -> int:
    root = Path(workdir)
    checkpoint = ensure_checkpoint(root / "checkpoint", DEMO_SPEC)
    socket_dir = str(root / "sockets")
    name = "demo"
    files = RankFiles(socket_dir, name, 0)
    daemon_args = DaemonArgs(model=str(checkpoint), name=name, socket_dir=socket_dir, dtype="bfloat16")
    daemon = subprocess.Popen([sys.executable, "-m", "weightcache", "daemon", *daemon_args.to_argv()])
    try:
        wait_ready(files, daemon, timeout_s=600)
        ready = files.read_ready()
        common = EngineArgs(model=str(checkpoint), dtype="bfloat16", weight_cache_fallback="error")
        dropped = drop_page_cache(checkpoint)
        disk = run_engine(common.but(weight_cache_mode="off"), max_new_tokens, root / "engine-disk.log")
        cached = run_engine(
            common.but(weight_cache_mode="client", socket_dir=socket_dir, name=name),
            max_new_tokens,
            root / "engine-cache.log",
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)

    gib = (ready.arena_bytes if ready else 0) / 2**30
    print()
    print(f"checkpoint: {checkpoint} ({gib:.2f} GiB of weights, {ready.tensor_count if ready else '?'} tensors)")
    print(f"daemon first load (disk → arena): {ready.load_seconds if ready else float('nan'):.3f} s")
    print()
    print(f"{'engine start':<26} {'weights ready':>14} {'to /ready':>10} {'to answer':>10}  completion")
    runs = ((f"from disk{' (cold cache)' if dropped else ''}", disk), ("from the weight cache", cached))
    for label, r in runs:
        print(
            f"{label:<26} {r['seconds'] * 1000:>11.1f} ms {r['ready_wall']:>8.2f} s {r['answered_wall']:>8.2f} s"
            f"  {r['completion']!r}"
        )
    print()
    print("startup phases, seconds (the engine's timeline, from the kernel's process start):")
    print(f"{'':<26} " + " ".join(f"{phase:>16}" for phase in PHASES))
    for label, r in runs:
        previous, cells = 0.0, []
        for phase in PHASES:
            cells.append(f"{r['marks'].get(phase, float('nan')) - previous:>16.3f}")
            previous = r["marks"].get(phase, previous)
        print(f"{label:<26} " + " ".join(cells))
    speedup = disk["seconds"] / max(cached["seconds"], 1e-9)
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
