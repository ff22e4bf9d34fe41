"""SGLang on a GPU from the weight cache, beside SGLang's own weight cache daemon.

Run on the GPU machine through tools/device/sglang-h200.sh (``bench SCENARIO``), which installs SGLang
0.5.17 there. Every engine is a real ``python -m sglang.launch_server`` answering greedy ``/generate``
requests over token ids; the daemon is ``weightcache daemon --profile sglang --backend cuda-vmm``
(keeper on), run as the operator renders it, with the same list of SGLang arguments as the engines;
SGLang's own daemon is ``python -m sglang.srt.weight_cache.daemon`` for rank 0 with the engine in
``--weight-cache-mode client``. Starts, per checkpoint:

- SGLang from disk, cold page cache (dropped first), then warm;
- SGLang from our cache (the daemon started first, its load not counted in the engine's start);
- SGLang from its own daemon (likewise);
- with ``--graphs``, one more start from our cache with CUDA graphs on (every other start has
  ``--disable-cuda-graph``).

Scenarios: ``smoke`` (a tiny Qwen3 and a tiny block-FP8 Qwen3-MoE), ``dense --size-gib N`` (a bf16
Qwen3 with Qwen3-8B's widths), ``moe --size-gib N`` (block-FP8 Qwen3-MoE with Qwen3-235B-A22B's
widths, as many layers as fit N GiB), and ``kill --model KIND`` (SIGKILL of each daemon under a serving
engine, then a new engine's start). Per start: SGLang's own weight phase (``Load weight end.
elapsed``), process start to ``/health`` and to the first token, the GPU memory the engine adds
(nvidia-smi), and the greedy tokens, which must be equal in every row.

A script, not a test: it prints a table and writes results-SCENARIO.json into --workdir.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gpu_serving
from gpu_serving import (
    MAX_TOKENS,
    OPENER,
    PROMPTS,
    Daemon,
    Started,
    checkpoint,
    free_port,
    gpu_used_mib,
    start_keeper,
    stop_children,
)
from weightcache_contract.launch import LOAD_FORMAT, SGLANG_PROFILE

WEIGHTS_PHASE = re.compile(r"Load weight end\. elapsed=([0-9.]+) s")
ERROR_LINE = re.compile(r"^\w*(?:Error|Exception): .*$", re.MULTILINE)
SGLANG_READY = "/tmp/sglang_weight_cache_rank0.ready"


def sglang_args(graphs: bool = False) -> list[str]:
    """One list for our daemon and every engine, as the operator renders it: FlashAttention 3 and
    FlashInfer's kernels are not carried (tools/device/sglang-h200.sh), a fixed KV pool so what an
    engine adds to the GPU's memory is comparable between starts. A dry run (``--cpu``): SGLang's CPU
    engine with its own attention and sampling."""
    if gpu_serving.DRY_RUN:
        return ["--device", "cpu", "--dtype", "bfloat16", "--context-length", "1024", "--max-total-tokens", "4096"]
    return [
        "--dtype",
        "bfloat16",
        "--attention-backend",
        "triton",
        "--sampling-backend",
        "pytorch",
        "--context-length",
        "1024",
        "--max-total-tokens",
        "16384",
        "--mem-fraction-static",
        "0.85",
        *([] if graphs else ["--disable-cuda-graph"]),
    ]


class Server(Started):
    """``python -m sglang.launch_server --model-path MODEL <args>`` in a process group of its own,
    timed from its start."""

    def __init__(self, model: Path, args: list[str], log: Path, extra: list[str] | None = None) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), *args, *(extra or [])]
        argv += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.log = log
        self.used_before = gpu_used_mib()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.healthy = self.wait_healthy(self.port, "sglang")
            self.used_after = gpu_used_mib()
            self.first_tokens = self.generate()
        except BaseException:
            self.stop()  # a server that failed its start holds no GPU memory under the next one
            raise
        self.first_token_s = time.perf_counter() - self.started

    def generate(self) -> list[list[int]]:
        out = []
        for ids in PROMPTS:
            body = {
                "input_ids": ids,
                "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True},
            }
            req = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/generate",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with OPENER.open(req, timeout=120) as r:
                out.append(json.loads(r.read())["output_ids"])
        return out

    def row(self, kind: str) -> dict[str, Any]:
        found = WEIGHTS_PHASE.findall(self.log.read_text())
        return {
            "start": kind,
            "weights_phase_s": float(found[-1]) if found else None,
            "to_health_s": round(self.healthy, 2),
            "to_first_token_s": round(self.first_token_s, 2),
            "engine_adds_mib": self.used_after - self.used_before,
            "tokens": self.first_tokens,
        }


class SglangDaemon(Started):
    """SGLang's own weight cache daemon for rank 0 (GPU 0), ready when its ready file is written."""

    def __init__(self, model: Path, log: Path) -> None:
        if os.path.exists(SGLANG_READY):
            os.unlink(SGLANG_READY)
        argv = [sys.executable, "-m", "sglang.srt.weight_cache.daemon", "--model-path", str(model)]
        argv += ["--gpu-id", "0", "--tp-rank", "0", "--tp-size", "1", "--dtype", "bfloat16"]
        self.log = log
        self.used_before = gpu_used_mib()
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 540
        while not os.path.exists(SGLANG_READY):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"SGLang's daemon not ready:\n{log.read_text()[-4000:]}")
            time.sleep(0.25)
        self.ready_s = time.perf_counter() - self.started
        self.gpu_added_mib = gpu_used_mib() - self.used_before


CLIENT = ["--weight-cache-mode", "client"]


def cache_flags(daemon: Daemon) -> list[str]:
    return ["--load-format", LOAD_FORMAT, "--model-loader-extra-config", json.dumps(daemon.cache())]


def attempt(rows: list[dict[str, Any]], label: str, start: Callable[[], dict[str, Any]]) -> None:
    """One start; a failure becomes a row that says why, and the next start still runs."""
    try:
        rows.append(start())
    except Exception as e:  # noqa: BLE001 - every start is reported, failed or not
        rows.append({"start": label, "error": f"{type(e).__name__}: {str(e)[-3000:]}"})
        traceback.print_exc()
    print(f"{label}: {json.dumps(rows[-1])[:600]}", flush=True)


def starts(
    model: Path, kind: str, logs: Path, socket_dir: str, cold: bool, graphs: bool, which: set[str]
) -> dict[str, Any]:
    from weightcache.checkpoints.page_cache import drop_page_cache

    args = sglang_args()
    rows: list[dict[str, Any]] = []
    daemons: dict[str, Any] = {}

    def disk(label: str, log: str) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            with Server(model, args, logs / f"{kind}-{log}.log") as s:
                return s.row(label)

        return go

    if cold and "disk" in which:
        drop_page_cache(model)
        attempt(rows, "SGLang from disk, cold page cache", disk("SGLang from disk, cold page cache", "disk-cold"))
    if "disk" in which:
        attempt(rows, "SGLang from disk, warm page cache", disk("SGLang from disk, warm page cache", "disk-warm"))
    if "cache" in which:
        ours_starts(model, kind, logs, socket_dir, graphs, rows, daemons)
    if "sglang" in which:
        sglang_starts(model, kind, logs, rows, daemons)
    return {"rows": rows, "daemons": daemons}


def ours_starts(
    model: Path,
    kind: str,
    logs: Path,
    socket_dir: str,
    graphs: bool,
    rows: list[dict[str, Any]],
    daemons: dict[str, Any],
) -> None:
    args = sglang_args()
    daemon = None
    try:
        daemon = Daemon(model, args, socket_dir, kind, logs / f"{kind}-daemon.log", SGLANG_PROFILE)
        daemons["ours"] = daemon.summary
        print(f"our daemon: {daemons['ours']}", flush=True)

        def ours(graphs_on: bool) -> Callable[[], dict[str, Any]]:
            label = "SGLang from our cache" + (", CUDA graphs on" if graphs_on else "")

            def go() -> dict[str, Any]:
                assert daemon is not None
                log = logs / f"{kind}-cache{'-graphs' if graphs_on else ''}.log"
                with Server(model, sglang_args(graphs_on), log, cache_flags(daemon)) as s:
                    return s.row(label)

            return go

        attempt(rows, "SGLang from our cache", ours(False))
        if graphs:
            attempt(rows, "SGLang from our cache, CUDA graphs on", ours(True))
    except Exception as e:  # noqa: BLE001
        daemons["ours"] = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
        traceback.print_exc()
    finally:
        if daemon is not None:
            daemon.stop()
            release_keeper(socket_dir, kind)


def release_keeper(socket_dir: str, name: str) -> None:
    """The keeper holds a stopped daemon's arena on the GPU; SGLang's own daemon needs the room."""
    from weightcache.daemon.keeper import KeeperClient, keeper_socket

    try:
        with KeeperClient(keeper_socket(socket_dir)) as keeper:
            print(f"keeper released {keeper.release(name)} arena(s) of {name}", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"keeper release of {name} failed: {type(e).__name__}: {e}", flush=True)


def sglang_starts(model: Path, kind: str, logs: Path, rows: list[dict[str, Any]], daemons: dict[str, Any]) -> None:
    args = sglang_args()
    sgl = None
    try:
        sgl = SglangDaemon(model, logs / f"{kind}-sglang-daemon.log")
        daemons["sglang"] = {"ready_s": round(sgl.ready_s, 1), "gpu_added_mib": sgl.gpu_added_mib}
        print(f"SGLang's daemon: {daemons['sglang']}", flush=True)

        def own() -> dict[str, Any]:
            with Server(model, args, logs / f"{kind}-sglang-client.log", CLIENT) as s:
                return s.row("SGLang from its own daemon")

        attempt(rows, "SGLang from its own daemon", own)
    except Exception as e:  # noqa: BLE001
        daemons["sglang"] = {"error": f"{type(e).__name__}: {str(e)[-3000:]}"}
        traceback.print_exc()
    finally:
        if sgl is not None:
            sgl.stop()


def last_error(text: str) -> str:
    """The last ``SomethingError: why`` line of a log: what a process that failed said last."""
    found = ERROR_LINE.findall(text)
    lines = text.strip().splitlines()
    return found[-1] if found else (lines[-1] if lines else "")


def kill_both(model: Path, kind: str, logs: Path, socket_dir: str) -> dict[str, Any]:
    """SIGKILL of each daemon under a serving engine, then a new engine's start. Each half records
    every step as it goes, so a step that fails (what SGLang does is the measurement) keeps the ones
    before it."""
    args = sglang_args()
    ours: dict[str, Any] = {}
    theirs: dict[str, Any] = {}
    out: dict[str, Any] = {"ours": ours, "sglang": theirs}
    daemon = successor = None
    try:
        daemon = Daemon(model, args, socket_dir, kind, logs / "kill-daemon.log", SGLANG_PROFILE)
        ours["daemon_ready_s"] = round(daemon.ready_s, 1)
        deadline = time.monotonic() + 60
        while not daemon.status().deposited and time.monotonic() < deadline:
            time.sleep(0.2)
        with Server(model, args, logs / "kill-cache.log", cache_flags(daemon)) as engine:
            before = engine.generate()
            daemon.kill()
            ours["serving_engine_answers_the_same_after_the_kill"] = engine.generate() == before
            t0 = time.perf_counter()
            successor = Daemon(model, args, socket_dir, kind, logs / "kill-successor.log", SGLANG_PROFILE)
            st = successor.status()
            ours |= {
                "successor_ready_s": round(time.perf_counter() - t0, 1),
                "successor_adopted": st.adopted,
                "successor_disk_bytes_read": st.disk_bytes_read,
                "and_after_the_successor_started": engine.generate() == before,
            }
        with Server(model, args, logs / "kill-cache-new.log", cache_flags(successor)) as fresh:
            ours["new_engine_answers_the_same"] = fresh.generate() == before
            ours["new_engine"] = fresh.row("new engine")
    except Exception as e:  # noqa: BLE001
        ours["error"] = f"{type(e).__name__}: {str(e)[-3000:]}"
        traceback.print_exc()
    finally:
        for d in (daemon, successor):
            if d is not None:
                d.stop()
        release_keeper(socket_dir, kind)
    print(f"ours: {json.dumps(ours)[:1500]}", flush=True)
    sgl = None
    try:
        sgl = SglangDaemon(model, logs / "kill-sglang-daemon.log")
        theirs["daemon_ready_s"] = round(sgl.ready_s, 1)
        with Server(model, args, logs / "kill-sglang-client.log", CLIENT) as engine:
            before = engine.generate()
            sgl.kill()
            try:
                theirs["serving_engine_answers_the_same_after_the_kill"] = engine.generate() == before
            except Exception as e:  # noqa: BLE001 - what SGLang does is the measurement
                theirs["serving_engine_after_the_kill"] = f"{type(e).__name__}: {e}"
            time.sleep(5)
            theirs["serving_engine_alive_5_s_later"] = engine.proc.poll() is None
            theirs["serving_engine_said"] = [ln for ln in engine.log.read_text().splitlines() if "died" in ln][-1:]
        new_log = logs / "kill-sglang-client-new.log"
        try:
            with Server(model, args, new_log, CLIENT) as fresh:
                theirs["new_engine_answers_the_same"] = fresh.generate() == before
                theirs["new_engine"] = fresh.row("new engine, SGLang's daemon gone")
                theirs["new_engine_fell_back_to_disk"] = "falling back to disk load" in fresh.log.read_text()
        except Exception:  # noqa: BLE001 - a new engine that cannot start is the measurement too
            theirs["new_engine_failed"] = last_error(new_log.read_text())
    except Exception as e:  # noqa: BLE001
        theirs["error"] = f"{type(e).__name__}: {str(e)[-3000:]}"
        traceback.print_exc()
    finally:
        if sgl is not None:
            sgl.stop()
    print(f"SGLang's: {json.dumps(theirs)[:1500]}", flush=True)
    return out


def print_table(title: str, result: dict[str, Any]) -> None:
    rows = result["rows"]
    print(f"\n{title}")
    print("| start | weight phase (s) | to /health (s) | to first token (s) | GPU memory the engine adds (MiB) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['start']} | failed: {r['error'].splitlines()[0][:150]} | | | |")
            continue
        phase = "—" if r["weights_phase_s"] is None else f"{r['weights_phase_s']:.2f}"
        print(
            f"| {r['start']} | {phase} | {r['to_health_s']:.1f} | {r['to_first_token_s']:.1f} | {r['engine_adds_mib']} |"
        )
    print(f"daemons: {json.dumps(result['daemons'])[:800]}")
    answered = [r for r in rows if "tokens" in r]
    same = len({json.dumps(r["tokens"]) for r in answered}) == 1
    print(f"greedy tokens identical in every row that answered ({len(answered)} of {len(rows)}): {same}")
    if not same:
        for r in answered:
            print(f"  {r['start']}: {r['tokens']}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=("smoke", "dense", "moe", "kill"))
    p.add_argument("--size-gib", type=float, default=16.0, help="dense, moe: the checkpoint's size")
    p.add_argument("--model", default="smoke", help="kill: the checkpoint (smoke, moe, dense, moe-large)")
    p.add_argument("--models", help="smoke: only these of its checkpoints (smoke, moe; comma-separated)")
    p.add_argument("--graphs", action="store_true", help="one more start from our cache with CUDA graphs on")
    p.add_argument(
        "--starts", default="disk,cache,sglang", help="which starts: disk, cache (ours), sglang (its own daemon)"
    )
    p.add_argument("--no-cold", action="store_true", help="no start from a cold page cache")
    p.add_argument("--cpu", action="store_true", help="a dry run of the steps on this CPU (SGLANG_USE_CPU_ENGINE=1)")
    p.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "weightcache-sglang-gpu"))
    args = p.parse_args()
    gpu_serving.DRY_RUN = args.cpu
    signal.signal(signal.SIGTERM, stop_children)
    work = Path(args.workdir)
    logs = work / f"logs-{args.scenario}"
    logs.mkdir(parents=True, exist_ok=True)
    socket_dir = tempfile.mkdtemp(prefix="wcs-")
    keeper = start_keeper(socket_dir, logs / "keeper.log")
    kinds = {"smoke": ["smoke", "moe"], "dense": ["dense"], "moe": ["moe-large"], "kill": [args.model]}
    if args.models:
        kinds["smoke"] = args.models.split(",")
    results: dict[str, Any] = {"scenario": args.scenario, "args": sglang_args(), "models": {}}
    try:
        for kind in kinds[args.scenario]:
            t0 = time.perf_counter()
            model = checkpoint(work, kind, args.size_gib)
            size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
            print(f"checkpoint {model}: {size / 2**30:.2f} GiB ({time.perf_counter() - t0:.0f} s)", flush=True)
            if args.scenario == "kill":
                results["models"][kind] = {"bytes": size, "kill": kill_both(model, kind, logs, socket_dir)}
                continue
            cold = args.scenario != "smoke" and not args.no_cold
            result = starts(model, kind, logs, socket_dir, cold, args.graphs, set(args.starts.split(",")))
            results["models"][kind] = {"bytes": size, **result}
            print_table(f"{kind}: {model.name}, {size / 2**30:.2f} GiB", result)
    finally:
        keeper.terminate()
        (work / f"results-{args.scenario}-{args.starts.replace(',', '-')}.json").write_text(
            json.dumps(results, indent=1, default=str)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
