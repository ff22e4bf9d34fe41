"""Engine restart benchmark: ``weightcache engine`` in ``off`` vs ``client`` mode on one checkpoint.

For each mode it starts the engine (the launcher and its rank processes) several times and
prints, per phase of the startup timeline, how long each took — process start → imports →
distributed init → weights bound → warm-up → ready — plus the wall time to ``/ready`` seen from
outside and the first-token latency of the first request (non-streaming, ``max_tokens=1``, and
the first SSE chunk of a streaming one). ``off`` runs twice: with the checkpoint's pages dropped
from the page cache first (a restart on a busy node) and warm. It is a script, not a test: it
prints a table and asserts nothing, except that every start generated the same greedy tokens.

``--code LABEL=DIR`` (repeatable) starts the engines from another source tree (a checkout with
``contract/`` and ``daemon_image/``), each tree a column per mode, starts interleaved: how one
change to the engine compares with the code before it, on the same daemon and checkpoint.

    PYTHONPATH=contract:daemon_image .venv/bin/python benchmarks/engine_restart.py --size-gib 1 --tp-size 2
    # one fresh engine on a GPU, from the cache, this tree against another checkout:
    PYTHONPATH=contract:daemon_image python3 benchmarks/engine_restart.py --family qwen3 --size-gib 1.7 \
        --tp-size 1 --backend cuda-vmm --modes client --code before=/tmp/main --code after=.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from weightcache.checkpoints.page_cache import drop_page_cache
from weightcache.engine.launcher import free_port
from weightcache.tools.bench import _checkpoint, spec_for
from weightcache.tools.sample_checkpoints import ModelSpec
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import DaemonArgs

PHASES = ("imports", "distributed_init", "weights_bound", "warmup", "ready")
MODES = {
    "off-cold": ("off (cold page cache)", "off"),
    "off-warm": ("off (warm page cache)", "off"),
    "client": ("client", "client"),
}
PROMPT = "The weight cache keeps"


def get(port: int, path: str, timeout: float = 5) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def post(port: int, path: str, body: dict, first_chunk: bool = False) -> tuple[float, dict | None]:
    """Seconds until the response (or, streaming, its first data chunk) arrives, and the JSON body
    of a non-streaming response."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
    started = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as r:
        if first_chunk:
            for line in r:
                if line.startswith(b"data: "):
                    elapsed = time.perf_counter() - started
                    r.read()
                    return elapsed, None
        data = r.read()
    return time.perf_counter() - started, json.loads(data)


def one_start(
    model: Path, tp: int, mode: str, backend: str, socket_dir: str, name: str, log: Path, env: dict[str, str]
) -> dict:
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "weightcache",
        "engine",
        "--model",
        str(model),
        "--port",
        str(port),
        "--tp-size",
        str(tp),
        "--weight-cache-mode",
        mode,
        "--weight-cache-fallback",
        "error",
        "--socket-dir",
        socket_dir,
        "--name",
        name,
        "--dtype",
        "bfloat16",
        "--backend",
        backend,
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"engine exited {proc.returncode}; see {log}")
            try:
                if get(port, "/ready", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.005)
        ready_wall = time.perf_counter() - started
        prompt = {"prompt": PROMPT, "max_tokens": 1, "temperature": 0}
        first_token, _ = post(port, "/v1/completions", prompt)
        first_chunk, _ = post(port, "/v1/completions", {**prompt, "max_tokens": 8, "stream": True}, first_chunk=True)
        # Greedy tokens of every start, compared at the end: a faster start must say the same thing.
        _, body = post(port, "/v1/completions", {**prompt, "max_tokens": 8, "return_token_ids": True})
        metrics = get(port, "/metrics")[1]
        health = json.loads(get(port, "/health")[1])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    marks = {
        m.group(1): float(m.group(2))
        for m in re.finditer(r'weightcache_engine_startup_seconds\{phase="(\w+)",rank="0"\} (\S+)', metrics)
    }
    durations, previous = {}, 0.0
    for phase in PHASES:
        durations[phase] = marks[phase] - previous
        previous = marks[phase]
    weights = [r["weights"] for r in health["ranks"]]
    assert body is not None
    return {
        "ready_wall": ready_wall,
        "launcher": ready_wall - marks["ready"],
        **durations,
        "weight_seconds": max(w["seconds"] for w in weights),
        "modes": sorted({w["mode"] for w in weights}),
        "bytes": sum(w["bytes_mapped"] + w["bytes_loaded"] for w in weights),
        "first_token": first_token,
        "first_chunk": first_chunk,
        "tokens": body["choices"][0]["token_ids"],
    }


def engine_spec(size_gib: float, tensors: int, family: str = "llama") -> ModelSpec:
    """``weightcache bench``'s Llama shape, rounded so that heads, kv heads and MLP split for tp ≤ 4."""
    base = spec_for(size_gib, tensors)
    hidden = max(512, round(base.hidden_size / 512) * 512)
    return dataclasses.replace(
        base,
        family=family,
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75) // 512 * 512,
        num_heads=hidden // 64,
        num_kv_heads=hidden // 128,
        tokenizer=True,
    )


def code_env(tree: str | None) -> dict[str, str]:
    """The environment of an engine started from ``tree`` (this process's own code when None)."""
    if tree is None:
        return dict(os.environ)
    root = Path(tree).resolve()
    for part in ("contract", "daemon_image"):
        if not (root / part).is_dir():
            raise SystemExit(f"--code {tree}: no {part}/ there; give the root of a weightcache checkout")
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "contract"), str(root / "daemon_image"), *rest])}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.0, help="approximate checkpoint size (bf16)")
    p.add_argument("--tensors", type=int, default=300, help="approximate tensor count")
    p.add_argument("--family", default="llama", choices=["llama", "qwen2", "qwen3"], help="model family")
    p.add_argument("--tp-size", type=int, default=2)
    p.add_argument("--backend", default="cpu-shm", help="arena backend (cuda-vmm: weights and compute on GPUs)")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma list of {', '.join(MODES)}")
    p.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="start engines from this checkout (repeatable; default: this tree)",
    )
    p.add_argument("--runs", type=int, default=3, help="engine starts per mode")
    p.add_argument("--workdir", default=None, help="where the checkpoint is generated and kept between runs")
    args = p.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES]:
        raise SystemExit(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    trees: list[tuple[str, str | None]] = []
    for item in args.code:
        label, sep, tree = item.partition("=")
        if not sep or not label or not tree:
            raise SystemExit(f"--code wants LABEL=DIR, got {item!r}")
        trees.append((label, tree))
    envs = {label: code_env(tree) for label, tree in trees} or {"": code_env(None)}

    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench-engine"))
    spec = engine_spec(args.size_gib, args.tensors, args.family)
    device = "cuda" if args.backend.startswith("cuda") else "cpu"
    model = _checkpoint(workdir, spec, device)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    socket_dir = tempfile.mkdtemp(prefix="wcb-")
    name = "bench"
    started = time.perf_counter()
    daemon_args = DaemonArgs(
        model=str(model),
        name=name,
        socket_dir=socket_dir,
        backend=args.backend,
        dtype="bfloat16",
        tp_size=args.tp_size,
        ranks=tuple(range(args.tp_size)),
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "weightcache", "--log-level", "warning", "daemon", *daemon_args.to_argv()],
        start_new_session=True,
    )
    labels = [f"{code} {MODES[m][0]}".strip() for m in modes for code in envs]
    results: dict[str, list[dict]] = {label: [] for label in labels}
    try:
        files = [RankFiles(socket_dir, name, r) for r in range(args.tp_size)]
        while not all(f.ready.exists() for f in files):
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited {daemon.returncode}")
            time.sleep(0.01)
        daemon_s = time.perf_counter() - started
        for run in range(args.runs):
            for m in modes:
                title, mode = MODES[m]
                for code, env in envs.items():  # interleaved: drift in the machine's load hits every tree alike
                    label = f"{code} {title}".strip()
                    if m == "off-cold":
                        drop_page_cache(model)
                    log = Path(workdir) / f"engine-{code or 'this'}-{m}-{run}.log"
                    results[label].append(
                        one_start(model, args.tp_size, mode, args.backend, socket_dir, name, log, env)
                    )
                    print(
                        f"run {run + 1}/{args.runs} {label}: ready in {results[label][-1]['ready_wall']:.3f} s",
                        flush=True,
                    )
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)

    print(
        f"\ncheckpoint: {size / 2**30:.2f} GiB bf16 {spec.family}, {spec.num_layers} layers, hidden "
        f"{spec.hidden_size}; tp={args.tp_size}; backend {args.backend}; daemon first load {daemon_s:.2f} s; "
        f"median of {args.runs} starts per column; {os.cpu_count()} CPUs\n"
    )
    rows = [
        ("to /ready, wall (launcher start → 200)", "ready_wall", 1),
        ("  launcher (parse, spawn ranks)", "launcher", 1),
        ("  rank 0: process start → imports", "imports", 1),
        ("  rank 0: distributed init", "distributed_init", 1),
        ("  rank 0: weights bound (map or load + model)", "weights_bound", 1),
        ("  rank 0: warm-up", "warmup", 1),
        ("weights: slowest rank's map/load", "weight_seconds", 1),
        ("first token, non-streaming (max_tokens=1)", "first_token", 1000),
        ("first SSE chunk, streaming", "first_chunk", 1000),
    ]
    header = f"| {'phase':<46} | " + " | ".join(f"{label:>22}" for label in labels) + " |"
    print(header)
    print("|" + "-" * 48 + "|" + "|".join("-" * 24 for _ in labels) + "|")
    for title, key, scale in rows:
        unit = "ms" if scale == 1000 else "s"
        cells = [f"{statistics.median(r[key] for r in results[label]) * scale:.3f} {unit}" for label in labels]
        print(f"| {title:<46} | " + " | ".join(f"{c:>22}" for c in cells) + " |")
    used = " | ".join(
        f"{label}: {results[label][0]['modes']}, {results[label][0]['bytes'] / 2**30:.2f} GiB" for label in labels
    )
    print(f"\nweights used: {used}")
    tokens = {json.dumps(r["tokens"]) for label in labels for r in results[label]}
    print(
        f"greedy tokens ({PROMPT!r}, 8): {'the same in every start' if len(tokens) == 1 else 'DIFFER: ' + str(tokens)}"
    )
    return 0 if len(tokens) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
