"""vLLM on a GPU from the weight cache: ``vllm serve`` from disk and from a ``--profile vllm`` daemon.

Run on the GPU machine through tools/device/vllm-h200.sh (``bench SCENARIO``), which installs vLLM
0.26 there. Every engine is a real ``vllm serve`` process (OpenAI API, greedy completions over token
ids); the daemon is ``weightcache daemon --profile vllm --backend cuda-vmm``, run exactly as the
operator renders it, with the same list of vLLM arguments as the engines. Scenarios:

- ``smoke``: a tiny Qwen3; the cache's greedy tokens equal vLLM-from-disk's.
- ``dense --size-gib 16``: a generated bf16 Qwen3 of that size; vLLM from disk (cold page cache, then
  warm) and from the cache: the weight phase (vLLM's "Loading weights took" / the plug-in's "Mapping
  and binding weights took"), process start to /health and to the first token, the GPU memory the
  engine adds (nvidia-smi) against the daemon's arena bytes, and the tokens.
- ``kill``: the daemon SIGKILLed under a serving engine, which keeps answering the same tokens; a new
  daemon re-adopts the arena from the keeper (0 bytes read); a new engine maps it and answers the same.
- ``moe``: a block-FP8 Qwen3-MoE through vLLM's FP8 path, from disk (cold, then warm page cache) and
  from the cache; ``moe-large --size-gib N``: the same at Qwen3-235B-A22B's widths, N GiB on disk.
  Every process runs with ``VLLM_REPLAY_KERNEL_ENV``, as the operator renders it on GPUs: vLLM 0.26
  then post-processes block FP8 for CUTLASS and the Triton MoE, which take the mapped weights as they
  are (docs/vllm.md), and the rows from disk use the same kernels.
- ``--starts disk,cache``: which starts (disk: vLLM's own loader; cache: from the daemon); starts from
  disk come first, before the daemon holds its arena. ``--repeat N``: each eager start from a warm
  page cache and from the cache N times; with ``--alternate`` they take turns (disk, cache, disk, …)
  with the daemon up throughout, so neither kind always comes later (a checkpoint the GPU holds
  twice). ``--graphs``: one more start of each kind with compilation and CUDA graphs on (no
  ``--enforce-eager``). Each row also says when vLLM's own log lines were reached (``MILESTONES``),
  which names where two starts differ.
- ``artifacts --size-gib N``: compilation and CUDA graphs on (no ``--enforce-eager``); a daemon with
  ``--artifact-dir`` and each engine under ``weightcache artifacts-run``, as the operator renders
  them with ``spec.engine.vllm.artifactCache``: a cold start (the directory empty; vLLM compiles, the
  daemon publishes) against a warm one (the entry copied in), each with an emptied home directory, so
  only the artifact directory can make a start warm; ``--runs`` pairs.

A script, not a test: it prints a table (and writes results.json into --workdir); the tokens columns
say whether every start answered the same.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from gpu_serving import (
    MAX_TOKENS,
    PROMPTS,
    Daemon,
    Started,
    checkpoint,
    free_port,
    gpu_total_mib,
    gpu_used_mib,
    start_keeper,
    stop_children,
    table,
)
from weightcache_contract.launch import LOAD_FORMAT, VLLM_PROFILE, VLLM_REPLAY_KERNEL_ENV

WEIGHTS_PHASE = re.compile(r"(Loading weights|Mapping and binding weights) took ([0-9.]+) seconds")
# vLLM's own log lines for where a compiled start spends its time (0.26 and 0.32 word them alike).
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
COMPILE = re.compile(r"torch.compile (?:takes|took) ([0-9.]+) s in total")
GRAPHS = re.compile(r"Graph capturing finished in ([0-9.]+) secs")
KV_BYTES = 4 * 2**30
# Where a start's seconds go, in vLLM's own lines (0.26): the API server's first line (its imports
# done), the engine core's first, the model load beginning and ending, the engine ready (profile, KV
# cache, warm-up or graphs), and the server listening.
MILESTONES = {
    "api server": re.compile(r"vLLM (API )?server version"),
    "engine core": re.compile(r"Initializing a V1 LLM engine"),
    "load starts": re.compile(r"Starting to load model"),
    "model loaded": re.compile(r"Model loading took"),
    "engine ready": re.compile(r"init engine \(profile"),
    "listening": re.compile(r"Starting vLLM (API )?server"),
}
LOG_TIME = re.compile(r"\b(\d\d-\d\d \d\d:\d\d:\d\d)\b")


def reached(text: str, started_wall: float) -> dict[str, int | None]:
    """Seconds from ``started_wall`` to the first line of each milestone (vLLM stamps its lines in
    local time, to the second, without the year)."""
    year = time.localtime(started_wall).tm_year
    out: dict[str, int | None] = dict.fromkeys(MILESTONES)
    for line in text.splitlines():
        for name, pattern in MILESTONES.items():
            if out[name] is None and pattern.search(line) and (stamp := LOG_TIME.search(line)):
                at = time.mktime(time.strptime(f"{year}-{stamp.group(1)}", "%Y-%m-%d %H:%M:%S"))
                out[name] = round(at - started_wall)
    return out


def vllm_args(extra: list[str] | None = None, eager: bool = True, utilization: str = "0.5") -> list[str]:
    """One list for the daemon and every engine, as the operator renders it. A fixed KV cache size, so
    what an engine adds to the GPU's memory is comparable between starts; a memory fraction that leaves
    room for the daemon's arena beside it (``fraction_beside``)."""
    return [
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "1024",
        *(["--enforce-eager"] if eager else []),
        "--kv-cache-memory-bytes",
        str(KV_BYTES),
        "--gpu-memory-utilization",
        utilization,
        *(extra or []),
    ]


def fraction_beside(checkpoint_bytes: int) -> str:
    """vLLM 0.26 starts only where ``--gpu-memory-utilization`` × the GPU's memory is free
    (``request_memory``), and an engine from the cache starts beside the daemon's arena, about the
    checkpoint's size: the fraction that leaves room for it and 2 GiB of CUDA contexts, 0.5 at most.
    The KV cache is sized by ``--kv-cache-memory-bytes``, not by this fraction."""
    total = gpu_total_mib() * 2**20
    return f"{max(0.05, min(0.5, (total - 1.05 * checkpoint_bytes - 2 * 2**30) / total)):.2f}"


class Serve(Started):
    """``vllm serve MODEL <args>`` in a process group of its own, timed from its start; with
    ``artifacts``, under ``weightcache artifacts-run --dir ARTIFACTS`` and a fresh home directory."""

    def __init__(
        self,
        model: Path,
        args: list[str],
        log: Path,
        cache: dict[str, Any] | None = None,
        artifacts: Path | None = None,
    ) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", str(model), *args]
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--served-model-name", "m"]
        if cache is not None:
            argv += ["--load-format", LOAD_FORMAT, "--model-loader-extra-config", json.dumps(cache)]
        env = dict(os.environ)
        if artifacts is not None:
            health = f"http://127.0.0.1:{self.port}/health"
            wrapper = [
                sys.executable,
                "-m",
                "weightcache",
                "artifacts-run",
                "--dir",
                str(artifacts),
                "--health",
                health,
                "--profile",
                "vllm",
            ]
            argv = [*wrapper, "--", *argv]
            # The wrapper points vLLM's, Inductor's and Triton's caches into the engine's staging; a
            # home emptied before every start keeps anything compiled earlier on this machine
            # (~/.cache, ~/.nv) out of it. One path for all starts, as in an engine image: vLLM 0.26
            # hashes paths under HOME into the name of its compile-cache directory.
            home = artifacts.parent / "home"
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            env["HOME"] = str(home)
        self.log = log
        self.used_before = gpu_used_mib()
        self.started = time.perf_counter()
        self.started_wall = time.time()
        self.proc = subprocess.Popen(
            argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        self.healthy = self.wait_healthy(self.port, "vllm serve")
        self.used_after = gpu_used_mib()
        t0 = time.perf_counter()
        self.first_tokens = self.complete()
        self.first_token_s = time.perf_counter() - self.started
        self.first_request_s = time.perf_counter() - t0

    def complete(self, prompts: list[list[int]] = PROMPTS) -> list[list[int]]:
        """Greedy token ids for each prompt (``return_token_ids``), or the texts when not given."""
        out = []
        for ids in prompts:
            body = {"model": "m", "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0.0}
            body |= {"ignore_eos": True, "return_token_ids": True}
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/v1/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                choice = json.loads(r.read())["choices"][0]
            out.append(choice.get("token_ids") or choice["text"])
        return out

    def weights_phase(self) -> float | None:
        found = [m for line in self.log.read_text().splitlines() if (m := WEIGHTS_PHASE.search(line))]
        return float(found[-1].group(2)) if found else None

    def row(self, kind: str) -> dict[str, Any]:
        text = self.log.read_text()

        def last(pattern: re.Pattern[str]) -> float | None:
            found = pattern.findall(text)
            return float(found[-1]) if found else None

        said = [
            line.split("Compile artifacts:", 1)[1].strip() for line in text.splitlines() if "Compile artifacts:" in line
        ]
        return {
            "start": kind,
            "weights_phase_s": self.weights_phase(),
            "to_health_s": round(self.healthy, 2),
            "to_first_token_s": round(self.first_token_s, 2),
            "engine_adds_mib": self.used_after - self.used_before,
            "tokens": self.first_tokens,
            "init_engine_s": last(INIT_ENGINE),
            "compile_s": last(COMPILE),
            "graphs_s": last(GRAPHS),
            "artifacts": said[-1] if said else None,
            "milestones": reached(text, self.started_wall),
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=("smoke", "dense", "kill", "moe", "moe-large", "artifacts"))
    p.add_argument(
        "--size-gib", type=float, default=16.0, help="dense, kill, moe-large, artifacts: the checkpoint's size"
    )
    p.add_argument(
        "--starts", default="disk,cache", help="which starts: disk (vLLM's own loader), cache (from the daemon)"
    )
    p.add_argument("--graphs", action="store_true", help="also a start of each kind with CUDA graphs on")
    p.add_argument("--no-cold", action="store_true", help="no start from a cold page cache")
    p.add_argument("--repeat", type=int, default=1, help="eager starts from a warm page cache and from the cache")
    p.add_argument(
        "--alternate", action="store_true", help="with --repeat: warm disk and cache starts take turns, daemon up"
    )
    p.add_argument("--runs", type=int, default=1, help="artifacts: cold/warm pairs")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "weightcache-vllm-gpu"))
    args = p.parse_args()
    from weightcache.checkpoints.page_cache import drop_page_cache

    os.environ.update(VLLM_REPLAY_KERNEL_ENV)  # daemon and engines alike, as the operator renders them
    signal.signal(signal.SIGTERM, stop_children)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    logs = work / f"logs-{args.scenario}"
    logs.mkdir(exist_ok=True)
    kind = "dense" if args.scenario in ("dense", "kill", "artifacts") else args.scenario
    t0 = time.perf_counter()
    model = checkpoint(work, kind, args.size_gib)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    print(f"checkpoint {model}: {size / 2**30:.2f} GiB ({time.perf_counter() - t0:.0f} s to have it)", flush=True)
    if args.scenario == "artifacts":
        return artifacts_scenario(model, work, logs, args.runs)
    utilization = fraction_beside(size)
    engine_args = vllm_args(utilization=utilization)
    graphs_args = vllm_args(eager=False, utilization=utilization)
    print(f"vllm serve {' '.join(engine_args)}", flush=True)
    starts = set(args.starts.split(","))
    numbered = (lambda kind, i: f"{kind} ({i + 1})") if args.repeat > 1 else (lambda kind, i: kind)
    rows: list[dict[str, Any]] = []
    # Alternating takes the order out of a comparison of starts: each start pays what the one
    # before it left (the page cache, compile caches, a process still exiting) whatever its kind.
    alternate = args.alternate and {"disk", "cache"} <= starts and args.scenario != "kill"

    def warm_disk_start(i: int) -> dict[str, Any]:
        with Serve(model, engine_args, logs / f"disk-warm-{i}.log") as engine:
            row = engine.row(numbered("vLLM from disk, warm page cache", i))
        print(f"disk warm: {row}", flush=True)
        return row

    results: dict[str, Any] = {"scenario": args.scenario, "checkpoint_bytes": size, "args": engine_args, "rows": rows}
    # Starts from disk first, with no daemon on the GPU: a 60 GiB checkpoint does not fit twice.
    if "disk" in starts and args.scenario != "kill":
        if not args.no_cold:
            before = page_cache_gib()
            dropped = drop_page_cache(model)
            print(
                f"page cache: {before:.1f} GiB before the drop, {page_cache_gib():.1f} GiB after "
                f"({'every file dropped' if dropped else 'the kernel refused some files: not a cold start'})",
                flush=True,
            )
            with Serve(model, engine_args, logs / "disk-cold.log") as engine:
                rows.append(engine.row("vLLM from disk, cold page cache"))
            print(f"disk cold: {rows[-1]}", flush=True)
        for i in range(0 if alternate else args.repeat):
            rows.append(warm_disk_start(i))
        if args.graphs:
            with Serve(model, graphs_args, logs / "disk-graphs.log") as engine:
                rows.append(engine.row("vLLM from disk, warm page cache, CUDA graphs on"))
            print(f"disk, graphs: {rows[-1]}", flush=True)
    arena_bytes = None
    if "cache" in starts or args.scenario == "kill":
        socket_dir = tempfile.mkdtemp(prefix="wcv-")
        keeper = start_keeper(socket_dir, logs / "keeper.log")
        daemon = None
        try:
            daemon = Daemon(model, engine_args, socket_dir, kind, logs / "daemon.log", VLLM_PROFILE)
            results["daemon"] = daemon.summary
            arena_bytes = daemon.summary["arena_bytes"]
            print(f"daemon: {results['daemon']}", flush=True)
            for i in range(1 if args.scenario == "kill" else args.repeat):
                if alternate:
                    rows.append(warm_disk_start(i))  # beside the daemon's arena
                with Serve(model, engine_args, logs / f"cache-{i}.log", cache=daemon.cache()) as engine:
                    rows.append(engine.row(numbered("vLLM from the cache", i)))
                    print(f"cache: {rows[-1]}", flush=True)
                    if args.scenario == "kill":
                        results["kill"] = kill_scenario(daemon, engine, model, engine_args, socket_dir, kind, logs)
                        daemon = results["kill"].pop("successor")
            if args.graphs and args.scenario != "kill":
                # Compilation and CUDA graphs change no weight: the same fingerprint, the same arena.
                with Serve(model, graphs_args, logs / "cache-graphs.log", cache=daemon.cache()) as engine:
                    rows.append(engine.row("vLLM from the cache, CUDA graphs on"))
                print(f"cache, graphs: {rows[-1]}", flush=True)
        finally:
            if daemon is not None:
                daemon.stop()
            keeper.terminate()
    if args.scenario != "kill":
        table(rows, arena_bytes)
        milestones(rows)
    (work / f"results-{args.scenario}-{args.starts.replace(',', '-')}.json").write_text(
        json.dumps(results, indent=1, default=str)
    )
    return 0


def page_cache_gib() -> float:
    """The machine's page cache (``Cached`` in /proc/meminfo), to show a drop took effect."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Cached:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def milestones(rows: list[dict[str, Any]]) -> None:
    """Where each start spent its time to ``/health``: seconds from the process's start to each of
    vLLM's own log lines in ``MILESTONES`` (their timestamps are whole seconds)."""
    print("\n| start | " + " | ".join(MILESTONES) + " | /health |")
    print("| --- |" + " ---: |" * (len(MILESTONES) + 1))
    for r in rows:
        cells = ["—" if r["milestones"].get(k) is None else str(r["milestones"][k]) for k in MILESTONES]
        print(f"| {r['start']} | {' | '.join(cells)} | {r['to_health_s']:.0f} |")


def artifacts_scenario(model: Path, work: Path, logs: Path, runs: int) -> int:
    from weightcache.artifacts.store import Store

    engine_args = vllm_args(eager=False)
    root = Path(tempfile.mkdtemp(prefix="artifacts-", dir=work)) / "dir"
    socket_dir = tempfile.mkdtemp(prefix="wcv-")
    keeper = start_keeper(socket_dir, logs / "keeper.log")
    store = Store(root)
    rows: list[dict[str, Any]] = []
    daemon = None
    try:
        daemon = Daemon(model, engine_args, socket_dir, "artifacts", logs / "daemon.log", VLLM_PROFILE, artifacts=root)
        for run in range(runs):
            store.evict(0)  # no engine runs now: the cold start finds nothing
            with Serve(model, engine_args, logs / f"cold-{run}.log", cache=daemon.cache(), artifacts=root) as engine:
                rows.append(engine.row("cold: vLLM compiles, the daemon publishes"))
                deadline = time.monotonic() + 300  # a miss is published while its engine still serves
                while not store.list_entries() and time.monotonic() < deadline:
                    time.sleep(0.2)
            entries = store.list_entries()
            rows[-1]["published_bytes"] = sum(e.bytes for e in entries)
            print(f"run {run + 1}/{runs} cold: {rows[-1]}", flush=True)
            if not entries:
                raise SystemExit(f"nothing was published in {root}; see {logs}")
            with Serve(model, engine_args, logs / f"warm-{run}.log", cache=daemon.cache(), artifacts=root) as engine:
                rows.append(engine.row("warm: the entry copied in"))
            print(f"run {run + 1}/{runs} warm: {rows[-1]}", flush=True)
    finally:
        if daemon is not None:
            daemon.stop()
        keeper.terminate()
    (work / "results-artifacts.json").write_text(json.dumps({"args": engine_args, "rows": rows}, indent=1))
    same = len({json.dumps(r["tokens"]) for r in rows}) == 1
    print(f"\nvllm serve {' '.join(engine_args)} (compilation and CUDA graphs on), from the cache")
    print(
        "| start | to /health (s) | init engine (s) | torch.compile (s) | graph capture (s) | weight phase (s) | artifacts |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        cells = [r["to_health_s"], r["init_engine_s"], r["compile_s"], r["graphs_s"], r["weights_phase_s"]]
        text = " | ".join("—" if c is None else f"{c:.2f}" for c in cells)
        print(f"| {r['start']} | {text} | {r['artifacts']} |")
    print(f"greedy tokens identical in every start: {same}")
    return 0


def kill_scenario(
    daemon: Daemon, engine: Serve, model: Path, args: list[str], socket_dir: str, name: str, logs: Path
) -> dict[str, Any]:
    before = engine.complete()
    deadline = time.monotonic() + 60
    while not daemon.status().deposited and time.monotonic() < deadline:
        time.sleep(0.2)
    daemon.kill()
    after_kill = engine.complete()
    t0 = time.perf_counter()
    successor = Daemon(model, args, socket_dir, name, logs / "daemon-successor.log", VLLM_PROFILE)
    st = successor.status()
    readopt_s = time.perf_counter() - t0
    still = engine.complete()
    engine.stop()
    with Serve(model, args, logs / "cache-after-kill.log", cache=successor.cache()) as fresh:
        again = fresh.complete()
        fresh_row = fresh.row("new engine, re-adopted arena")
    out = {
        "serving_engine_answers_the_same_after_the_kill": after_kill == before,
        "and_after_the_successor_started": still == before,
        "successor_adopted": st.adopted,
        "successor_disk_bytes_read": st.disk_bytes_read,
        "successor_ready_s": round(readopt_s, 1),
        "new_engine_answers_the_same": again == before,
        "new_engine": fresh_row,
        "successor": successor,
    }
    print("\n| after the daemon's SIGKILL | |\n| --- | --- |")
    for key, value in out.items():
        if key not in ("successor", "new_engine"):
            print(f"| {key.replace('_', ' ')} | {value} |")
    r = fresh_row
    print(
        f"| new engine: weight phase, to first token | {r['weights_phase_s']} s, {r['to_first_token_s']} s "
        f"(adds {r['engine_adds_mib']} MiB) |"
    )
    return out


if __name__ == "__main__":
    raise SystemExit(main())
