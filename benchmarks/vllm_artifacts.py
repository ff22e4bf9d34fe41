"""Compile-artifact benchmark: ``vllm serve`` (CPU, torch.compile on: no ``--enforce-eager``) to
``/health`` with the node's artifact directory empty (cold: vLLM compiles) and with its key
published (warm: the entry is copied into the engine's ``VLLM_CACHE_ROOT`` and vLLM loads the
compiled graphs).

Everything is real and as the operator renders it: a ``weightcache daemon --profile vllm
--artifact-dir DIR`` holding the example's tiny Qwen3 (examples/weightcache-vllm-cpu.yaml) and
publishing, and each engine ``weightcache artifacts-run --dir DIR --health URL -- vllm serve …
--load-format weightcache``. A cold start begins with no entries (the previous one's evicted) and
a fresh home directory outside the artifact directory, so nothing compiled earlier
helps it. Each start is a fresh process; the time is from its spawn to the first 200 of
``/health``. It prints a table and asserts nothing (a script, not a test).

    flock /tmp/wc-e2e.lock env PYTHONPATH=contract:daemon_image:operator:tests/cluster \\
        .venv/bin/python benchmarks/vllm_artifacts.py --runs 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from weightcache.artifacts.engine import healthy
from weightcache.artifacts.store import Store
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import LOAD_FORMAT, VLLM_PROFILE, DaemonArgs

REPO = Path(__file__).resolve().parents[1]
NAME = "bench"
INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")


def engine_args() -> list[str]:
    """The example's shared vLLM list without ``--enforce-eager`` (compilation on), as rendered."""
    from testcluster.sample import rendered_vllm_args

    return [a for a in rendered_vllm_args() if a != "--enforce-eager"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(
    model: Path,
    root: Path,
    socket_dir: str,
    scratch: Path,
    log: Path,
    before_stop: Callable[[], object],
    extra_env: dict[str, str],
) -> tuple[float, float, str]:
    """One engine start under the artifact wrapper: seconds to /health, vLLM's own "init engine
    (profile, create kv cache, warmup model)" seconds (where compilation happens), and what the
    loader said about the artifacts.
    ``before_stop`` runs while the engine still serves (a miss is published only then)."""
    port = free_port()
    health = f"http://127.0.0.1:{port}/health"
    extra = json.dumps({"socket_dir": socket_dir, "name": NAME, "fallback": "error"})
    argv = [sys.executable, "-m", "weightcache", "artifacts-run", "--dir", str(root), "--health", health]
    argv += ["--profile", "vllm", "--"]
    vllm = str(Path(sys.executable).parent / "vllm")  # the console script next to this interpreter
    argv += [vllm, "serve", str(model), *engine_args(), "--load-format", LOAD_FORMAT]
    argv += ["--model-loader-extra-config", extra, "--host", "127.0.0.1", "--port", str(port)]
    env = {
        **os.environ,
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        # The home directory starts empty on every start (the wrapper points vLLM's, Inductor's and
        # Triton's caches into the engine's staging), so only the artifact directory can make a
        # start warm.
        "HOME": tempfile.mkdtemp(prefix="home-", dir=scratch),
        **extra_env,
    }
    began = time.perf_counter()
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            while not healthy(health):
                if proc.poll() is not None:
                    raise SystemExit(f"engine exited {proc.returncode}; see {log}")
                time.sleep(0.1)
            took = time.perf_counter() - began
            before_stop()
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=120)
    text = log.read_text()
    said = [line for line in text.splitlines() if "Compile artifacts:" in line]
    init = INIT_ENGINE.findall(text)
    claim = said[-1].split("Compile artifacts:", 1)[1].strip() if said else "no artifact claim logged"
    return took, float(init[-1]) if init else float("nan"), claim


def wait_published(store: Store, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while not store.list_entries():
        if time.monotonic() > deadline:
            raise SystemExit(f"nothing was published in {store.root} within {timeout_s} s")
        time.sleep(0.2)
    return sum(e.bytes for e in store.list_entries())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=2, help="starts per kind (medians are printed)")
    p.add_argument("--workdir", default=None)
    p.add_argument("--engine-env", action="append", default=[], metavar="NAME=VALUE", help="more engine environment")
    args = p.parse_args()
    extra_env = dict(item.split("=", 1) for item in args.engine_env)
    from testcluster.sample import VLLM_SAMPLE, generate_checkpoint

    work = Path(args.workdir or tempfile.mkdtemp(prefix="wc-bench-artifacts-"))
    model = work / "model"
    if not (model / "config.json").exists():
        generate_checkpoint(model, VLLM_SAMPLE)
    root, scratch = work / "artifacts", work / "scratch"
    scratch.mkdir(exist_ok=True)
    socket_dir = tempfile.mkdtemp(prefix="wca-")
    store = Store(root)
    daemon_args = DaemonArgs(
        model=str(model),
        name=NAME,
        socket_dir=socket_dir,
        backend="cpu-shm",
        ranks=(0,),
        keeper="off",
        profile=VLLM_PROFILE,
        engine_args=tuple(engine_args()),
        artifact_dir=str(root),
    )
    daemon_argv = [sys.executable, "-m", "weightcache", "daemon", *daemon_args.to_argv()]
    daemon_log = work / "daemon.log"
    daemon = subprocess.Popen(
        daemon_argv,
        stdout=daemon_log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_HOST_IP": "127.0.0.1"},
        start_new_session=True,
    )
    results: dict[str, list[float]] = {"cold": [], "warm": []}
    notes: dict[str, list[str]] = {"cold": [], "warm": []}
    inits: dict[str, list[float]] = {"cold": [], "warm": []}
    published = 0
    try:
        while not RankFiles(socket_dir, NAME, 0).ready.exists():
            if daemon.poll() is not None:
                raise SystemExit(f"daemon exited {daemon.returncode}; see {daemon_log}")
            time.sleep(0.1)
        for run in range(args.runs):
            store.evict(0)  # no engine runs now: the cold start finds nothing
            took, init, said = start_engine(
                model, root, socket_dir, scratch, work / f"cold-{run}.log", lambda: wait_published(store), extra_env
            )
            results["cold"].append(took)
            inits["cold"].append(init)
            notes["cold"].append(said)
            published = sum(e.bytes for e in store.list_entries())
            print(f"run {run + 1}/{args.runs} cold: {took:.1f} s ({said}); published {published} bytes", flush=True)
            took, init, said = start_engine(
                model, root, socket_dir, scratch, work / f"warm-{run}.log", lambda: None, extra_env
            )
            results["warm"].append(took)
            inits["warm"].append(init)
            notes["warm"].append(said)
            print(f"run {run + 1}/{args.runs} warm: {took:.1f} s ({said})", flush=True)
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        daemon.wait(timeout=60)
    cold, warm = statistics.median(results["cold"]), statistics.median(results["warm"])
    (work / "results.json").write_text(json.dumps({"seconds": results, "init": inits, "claims": notes}, indent=1))
    print(f"\nvllm serve {' '.join(engine_args())} (compilation on), artifacts {published} bytes")
    print(f"medians of {args.runs} starts, seconds from spawn to /health 200:\n")
    print("| artifacts | to /health, each start (s) | median (s) | of it vLLM's init engine, median (s) |")
    print("| --- | --- | --- | --- |")
    for kind in ("cold", "warm"):
        each = ", ".join(f"{t:.1f}" for t in results[kind])
        print(f"| {kind} | {each} | {statistics.median(results[kind]):.1f} | {statistics.median(inits[kind]):.1f} |")
    init_ratio = statistics.median(inits["warm"]) / statistics.median(inits["cold"])
    print(f"\nwarm / cold: {warm / cold:.2f} to /health, {init_ratio:.2f} for vLLM's init engine")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
