"""SGLang start benchmark: one SGLang server (CPU) from disk with a cold page cache, from disk warm,
and from the weight cache (``--load-format weightcache``, ``fallback: error``), on the generated
Qwen3 checkpoint of benchmarks/vllm_start.py.

Each start is a fresh ``python -m sglang.launch_server`` (tests/sglang_engine/sglang_harness.py's
``Server``, with the kernel stand-in on its path and ``SGLANG_USE_CPU_ENGINE=1``), and the daemon is
``weightcache daemon --profile sglang --engine-args '<JSON>'`` with the servers' own SGLang
arguments, as the harness starts it. Measured per start:
- to ``/health``: seconds from spawning the server until ``/health`` answers 200 (polled every
  0.5 s by the harness, so up to 0.5 s late);
- SGLang's weight phase: its model runner's ``Load weight end. elapsed=X s`` (``load_model``: the
  load config, building the model and the loader's work, whichever loader it is; SGLang also reports
  it as ``load_weight`` in ``Engine startup timings (s): ...``, checked equal here to the rounding);
- of it, from the cache, the loader's ``Mapping and binding weights took X seconds`` (mapping the
  daemon's arena and binding views in place of the parameters; building the model on the meta device
  is in the weight phase, not in this);
- SGLang's ``scheduler_e2e`` from the same ``Engine startup timings`` line (the scheduler process's
  start, of which the weight phase is part);
- the first request (greedy, ``MAX_TOKENS`` tokens) and its output ids, compared across starts.
It is a script, not a test: it prints a table and asserts nothing, and stops at a start that fails.

    S=$(ls -d ~/.cache/weightcache/venv-sglang-*)
    PYTHONPATH=contract:daemon_image:operator $S/bin/python benchmarks/sglang_start.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from vllm_start import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sglang_engine"))
from sglang_harness import PROMPTS, Server, sglang_args, start_daemon  # noqa: E402

STARTS = ("disk, cold page cache", "disk, warm page cache", "weight cache")
MAX_TOKENS = 8
# SGLang 0.5.21's own lines (model_runner.py, entrypoints/engine.py) and the weightcache loader's.
LOAD_WEIGHT_END = re.compile(r"Load weight end\. elapsed=([0-9.]+) s")
STARTUP_TIMINGS = re.compile(r"Engine startup timings \(s\): load_weight=([0-9.]+), .*scheduler_e2e=([0-9.]+)")
MAP_AND_BIND = re.compile(r"Mapping and binding weights took ([0-9.]+) seconds")


def last(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    found = list(pattern.finditer(text))
    return found[-1] if found else None


def start_once(model: Path, args: list[str], log: Path, calls: Path, cache: dict | None) -> dict:
    """One fresh server: its time to health, its first request, then the phases from its log."""
    began = time.monotonic()
    server = Server(model, args, log=log, calls=calls, cache=cache)
    try:
        server.wait_healthy(timeout_s=900)
        healthy = time.monotonic() - began
        t0 = time.monotonic()
        [ids] = server.generate([PROMPTS[0]], MAX_TOKENS)
        first = time.monotonic() - t0
    finally:
        server.stop()
    text = log.read_text(errors="replace")
    end, timings, bound = last(LOAD_WEIGHT_END, text), last(STARTUP_TIMINGS, text), last(MAP_AND_BIND, text)
    if end is None or timings is None:
        raise SystemExit(f"SGLang's log lacks 'Load weight end' or 'Engine startup timings'; see {log}")
    if cache is not None and bound is None:
        raise SystemExit(f"the cache start did not log 'Mapping and binding weights took'; see {log}")
    return {
        "health": healthy,
        "load_weight_end": float(end.group(1)),
        "startup_load_weight": float(timings.group(1)),
        "scheduler_e2e": float(timings.group(2)),
        "map_and_bind": float(bound.group(1)) if bound else None,
        "first_request": first,
        "ids": ids,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.2, help="approximate checkpoint size (at least 1)")
    p.add_argument("--runs", type=int, default=3, help="starts per kind")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--workdir", default=None, help="where the checkpoint is generated and kept between runs")
    args = p.parse_args()

    from weightcache.checkpoints.page_cache import drop_page_cache

    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench-sglang"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = checkpoint(workdir, args.size_gib)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    engine_args = sglang_args(dtype=args.dtype)
    socket_dir, name = Path(tempfile.mkdtemp(prefix="wcs-")), "bench"
    calls = workdir / "kernel-calls"
    started = time.monotonic()
    daemon = start_daemon(model, socket_dir, name, engine_args, logs=workdir, calls=calls)
    results: dict[str, list[dict]] = {kind: [] for kind in STARTS}
    try:
        daemon.wait_ready(timeout_s=900)
        daemon_s = time.monotonic() - started
        cache = {"socket_dir": str(socket_dir), "name": name, "fallback": "error"}
        for run in range(args.runs):
            for kind in STARTS:
                if kind == "disk, cold page cache":
                    drop_page_cache(model)
                log = workdir / f"sglang-{re.sub(r'[^a-z]+', '-', kind)}-{run}.log"
                r = start_once(model, engine_args, log, calls, cache if kind == "weight cache" else None)
                results[kind].append(r)
                print(f"run {run + 1}/{args.runs} {kind}: " + json.dumps(r), flush=True)
    finally:
        daemon.stop()
        shutil.rmtree(socket_dir, ignore_errors=True)

    ids = {json.dumps(r["ids"]) for rs in results.values() for r in rs}
    print(f"\ncheckpoint: {model} ({size / 2**30:.2f} GiB); daemon ready in {daemon_s:.1f} s (SGLang load + publish)")
    print(f"first request's {MAX_TOKENS} greedy ids identical across all starts: {len(ids) == 1} ({sorted(ids)})")
    apart = [r for rs in results.values() for r in rs if abs(r["load_weight_end"] - r["startup_load_weight"]) > 0.011]
    print(f"'Load weight end' and 'Engine startup timings' load_weight agree in every start: {not apart}")
    print(f"medians of {args.runs} starts, seconds:\n")
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    cols = ("health", "load_weight_end", "map_and_bind", "scheduler_e2e", "first_request")
    print("| start | to /health | SGLang's weight phase | of it: map and bind | scheduler_e2e | first request |")
    print("| --- | --- | --- | --- | --- | --- |")
    med: dict[str, dict[str, float]] = {}
    for kind, rs in results.items():
        med[kind] = {}
        for col in cols:
            values = [r[col] for r in rs if r[col] is not None]
            med[kind][col] = statistics.median(values) if values else float("nan")
        m = med[kind]
        bind = "—" if m["map_and_bind"] != m["map_and_bind"] else f"{m['map_and_bind']:.3f}"
        cells = [f"{m['health']:.1f}", f"{m['load_weight_end']:.2f}", bind, f"{m['scheduler_e2e']:.1f}"]
        cells.append(f"{m['first_request']:.3f}")
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("\nSGLang's weight phase: 'Load weight end. elapsed=' (model runner's load_model, around any loader);")
    print("map and bind: the weightcache loader's 'Mapping and binding weights took'\n")
    for col, label in (("load_weight_end", "SGLang's weight phase"), ("health", "to /health")):
        cache = med["weight cache"][col]
        for kind in STARTS[:2]:
            print(f"{label}, {kind} / weight cache: {med[kind][col] / cache:.1f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
