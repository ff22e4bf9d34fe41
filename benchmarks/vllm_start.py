"""vLLM start benchmark: one vLLM engine (CPU) from disk with a cold page cache, from disk warm,
and from the weight cache (``--load-format weightcache``), on a generated Qwen3 checkpoint.

vLLM's start is split into the phase this project replaces and the rest:
- model load: ``get_model`` in vLLM's model runner — building the model, reading or mapping its
  weights and vLLM's post-processing (``process_weights_after_loading``);
- of it, the weights: from disk vLLM's own "Loading weights took" (reading the checkpoint into the
  built model's parameters), from the cache the loader's "Mapping and binding weights took" (mapping
  the daemon's arena and binding views of it in place of those parameters).
- the rest: everything else until ``LLM(...)`` returns (config, distributed init, KV cache,
  warm-up); then the first request's latency.
Each start is a fresh process (``--start`` below) with vLLM's engine core in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so the driver can time ``get_model`` by wrapping the model
runner's reference to it; the wrapper only reads the clock. It is a script, not a test: it prints
a table and asserts nothing.

    PYTHONPATH=contract:daemon_image:operator .venv/bin/python benchmarks/vllm_start.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from weightcache_contract.launch import LOAD_FORMAT, VLLM_PROFILE, DaemonArgs

STARTS = ("disk, cold page cache", "disk, warm page cache", "weight cache")
RESULT = "VLLM_START_RESULT "
WEIGHTS_PHASE = re.compile(r"(Loading weights|Mapping and binding weights) took ([0-9.]+) seconds")


def vllm_args(dtype: str) -> list[str]:
    """The engine arguments the daemon and every engine get, as the operator renders them: one list."""
    return ["--dtype", dtype, "--tensor-parallel-size", "1", "--max-model-len", "256", "--enforce-eager"]


def start_once(model: str, load_format: str, extra: str, dtype: str) -> None:
    """The body of one measured start (``--start``): build vLLM, time its phases, answer one request."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    began = time.perf_counter()
    import vllm.v1.worker.cpu_model_runner as runner
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    imported = time.perf_counter()
    timed: dict[str, float] = {}
    get_model = runner.get_model

    def timed_get_model(*args: object, **kwargs: object) -> object:
        t0 = time.perf_counter()
        try:
            return get_model(*args, **kwargs)
        finally:
            timed["model_load"] = time.perf_counter() - t0

    runner.get_model = timed_get_model
    llm = LLM(
        model=model,
        dtype=dtype,
        enforce_eager=True,
        max_model_len=256,
        load_format=load_format,
        model_loader_extra_config=json.loads(extra),
        kv_cache_memory_bytes=64 * 2**20,
    )
    built = time.perf_counter()
    t0 = time.perf_counter()
    out = llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], SamplingParams(temperature=0.0, max_tokens=1))
    first = time.perf_counter() - t0
    print(
        RESULT
        + json.dumps(
            {
                "imports": imported - began,
                "engine": built - imported,
                "model_load": timed["model_load"],
                "first_request": first,
                "token": out[0].outputs[0].token_ids[0],
            }
        ),
        flush=True,
    )


def run_start(model: Path, load_format: str, extra: dict, dtype: str, log: Path) -> dict:
    argv = [sys.executable, __file__, "--start", str(model), "--load-format", load_format, "--extra", json.dumps(extra)]
    argv += ["--dtype", dtype]
    # vLLM logs to stdout: one file holds its log and the result line.
    with log.open("w") as sink:
        proc = subprocess.run(argv, stdout=sink, stderr=subprocess.STDOUT, check=False)
    text = log.read_text().splitlines()
    lines = [line for line in text if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"vLLM start ({load_format}) failed with exit {proc.returncode}; see {log}")
    result = json.loads(lines[-1][len(RESULT) :])
    # From disk vLLM's own line; from the cache the loader's, which times the same phase (the
    # weights into the built model's parameters) and prints build and post-processing apart.
    phase = [m for line in text if (m := WEIGHTS_PHASE.search(line))]
    result["weights_phase"] = float(phase[-1].group(2)) if phase else None
    return result


def checkpoint(workdir: Path, gib: float) -> Path:
    """A Qwen3 checkpoint of about ``gib`` GiB (bf16, untied, Qwen3-0.6B's vocabulary and widths)."""
    from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint

    # Per layer: q,o 1024² + k,v 1024·512 + MLP 3·1024·3072 ≈ 12.6 M parameters; embeddings 2·151936·1024.
    layers = max(2, round((gib * 2**30 / 2 - 2 * 151936 * 1024) / 12.58e6))
    spec = ModelSpec(
        family="qwen3",
        hidden_size=1024,
        intermediate_size=3072,
        num_layers=layers,
        num_heads=16,
        num_kv_heads=8,
        vocab_size=151936,
        dtype="bfloat16",
        shards=4,
    )
    out = workdir / f"qwen3-{layers}l"
    if not (out / "config.json").exists():
        write_checkpoint(out, spec)
    return out


def start_daemon(model: Path, socket_dir: str, name: str, dtype: str, log: Path) -> subprocess.Popen[bytes]:
    daemon = DaemonArgs(
        model=str(model),
        name=name,
        socket_dir=socket_dir,
        backend="cpu-shm",
        keeper="off",
        profile=VLLM_PROFILE,
        engine_args=tuple(vllm_args(dtype)),
    )
    argv = [sys.executable, "-m", "weightcache", "daemon", *daemon.to_argv()]
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-gib", type=float, default=1.2, help="approximate checkpoint size (at least 1)")
    p.add_argument("--runs", type=int, default=3, help="starts per kind")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--workdir", default=None, help="where the checkpoint is generated and kept between runs")
    p.add_argument("--start", metavar="MODEL", help=argparse.SUPPRESS)
    p.add_argument("--load-format", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--extra", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.start:
        start_once(args.start, args.load_format, args.extra, args.dtype)
        return 0

    from weightcache.checkpoints.page_cache import drop_page_cache
    from weightcache.wire.rankfiles import RankFiles

    workdir = Path(args.workdir or os.path.join(tempfile.gettempdir(), "weightcache-bench-vllm"))
    workdir.mkdir(parents=True, exist_ok=True)
    model = checkpoint(workdir, args.size_gib)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    socket_dir, name = tempfile.mkdtemp(prefix="wcv-"), "bench"
    started = time.perf_counter()
    daemon = start_daemon(model, socket_dir, name, args.dtype, workdir / "daemon.log")
    results: dict[str, list[dict]] = {kind: [] for kind in STARTS}
    try:
        ready = RankFiles(socket_dir, name, 0).ready
        while not ready.exists():
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited {daemon.returncode}; see {workdir / 'daemon.log'}")
            time.sleep(0.05)
        daemon_s = time.perf_counter() - started
        extra = {"socket_dir": socket_dir, "name": name, "fallback": "error"}
        for run in range(args.runs):
            for kind in STARTS:
                if kind == "disk, cold page cache":
                    drop_page_cache(model)
                cached = kind == "weight cache"
                log = workdir / f"vllm-{re.sub(r'[^a-z]+', '-', kind)}-{run}.log"
                fmt, opts = (LOAD_FORMAT, extra) if cached else ("auto", {})
                results[kind].append(run_start(model, fmt, opts, args.dtype, log))
                r = results[kind][-1]
                print(f"run {run + 1}/{args.runs} {kind}: model load {r['model_load']:.3f} s", flush=True)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)

    tokens = {r["token"] for rs in results.values() for r in rs}
    print(f"\ncheckpoint: {model} ({size / 2**30:.2f} GiB); daemon ready in {daemon_s:.1f} s (vLLM load + publish)")
    print(f"first greedy token identical across all starts: {len(tokens) == 1} ({sorted(tokens)})")
    print(f"medians of {args.runs} starts, seconds:\n")
    (workdir / "results.json").write_text(json.dumps(results, indent=1))
    cols = ("model_load", "weights_phase", "imports", "engine", "first_request")
    print("| start | model load (get_model) | of it: the weights | imports | rest of LLM() | first request |")
    print("| --- | --- | --- | --- | --- | --- |")
    med: dict[str, dict[str, float]] = {}
    for kind, rs in results.items():
        med[kind] = {}
        for col in cols:
            values = [r[col] for r in rs if r[col] is not None]
            med[kind][col] = statistics.median(values) if values else float("nan")
        rest = med[kind]["engine"] - med[kind]["model_load"]
        loading = med[kind]["weights_phase"]
        cells = [f"{med[kind]['model_load']:.3f}", "—" if loading != loading else f"{loading:.3f}"]
        cells += [f"{med[kind]['imports']:.2f}", f"{rest:.2f}", f"{med[kind]['first_request']:.3f}"]
        print(f"| {kind} | " + " | ".join(cells) + " |")
    print("\nthe weights: from disk vLLM's 'Loading weights took'; from the cache the loader's 'Mapping and binding")
    print("weights took' (map + bind; building the model on the meta device and post-processing are in get_model)\n")
    for col, label in (("weights_phase", "the weights"), ("model_load", "model load (get_model)")):
        cache = med["weight cache"][col]
        for kind in STARTS[:2]:
            print(f"{label}, {kind} / weight cache: {med[kind][col] / cache:.0f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
