"""What the GPU engine benchmarks share (``vllm_gpu.py``, ``sglang_gpu.py``): the GPU's memory in
use, the daemon of an engine profile on a ``cuda-vmm`` arena with its keeper, the generated
checkpoints, and the table every scenario prints."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from weightcache_contract.launch import DaemonArgs, KeeperArgs

# A dry run of a benchmark's steps on a machine without a GPU (``--cpu``): cpu-shm arenas, checkpoints
# generated on the CPU, no GPU memory to read.
DRY_RUN = False
PROMPTS = [[1, 17, 300, 42, 9], [5, 6, 7, 8, 9, 10, 11, 12], [900, 3]]
MAX_TOKENS = 16
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def gpu_used_mib() -> int:
    return 0 if DRY_RUN else _gpu_mib("memory.used")


def gpu_total_mib() -> int:
    return _gpu_mib("memory.total")


def _gpu_mib(query: str) -> int:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip().splitlines()[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Started:
    """A process started in a process group of its own (``proc``, output in ``log``), timed from
    ``started``; stopping it stops its group, as a container's stop does."""

    proc: subprocess.Popen[bytes]
    log: Path
    started: float

    def wait_healthy(self, port: int, what: str, timeout_s: float = 540) -> float:
        """Seconds from the start until ``/health`` on ``port`` answered 200."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited {self.proc.returncode}:\n{self.log.read_text()[-4000:]}")
            try:
                with OPENER.open(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.perf_counter() - self.started
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"{what} not healthy in {timeout_s} s:\n{self.log.read_text()[-4000:]}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self, timeout_s: float = 120) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Daemon(Started):
    """``weightcache daemon --profile PROFILE --backend cuda-vmm`` for rank 0, keeper on."""

    def __init__(
        self,
        model: Path,
        args: list[str],
        socket_dir: str,
        name: str,
        log: Path,
        profile: str,
        artifacts: Path | None = None,
    ) -> None:
        self.socket_dir, self.name = socket_dir, name
        daemon = DaemonArgs(
            model=str(model),
            name=name,
            socket_dir=socket_dir,
            backend="cpu-shm" if DRY_RUN else "cuda-vmm",
            ranks=(0,),
            profile=profile,
            engine_args=tuple(args),
            artifact_dir=None if artifacts is None else str(artifacts),
        )
        argv = [sys.executable, "-m", "weightcache", "daemon", *daemon.to_argv()]
        self.log = log
        used = gpu_used_mib()
        self.started = time.perf_counter()
        self.launched = time.time()
        self.proc = subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self.ready_s = self._wait_ready()
        except BaseException:
            self.stop()  # a daemon that never got ready holds no GPU memory under the next start
            raise
        st = self.status()
        self.summary = {
            "ready_s": round(self.ready_s, 1),
            "arena_bytes": st.arena_bytes,
            "gpu_added_mib": gpu_used_mib() - used,
            "disk_bytes_read": st.disk_bytes_read,
        }
        """Its start, once ready: seconds, arena bytes, GPU memory added, bytes read from disk."""

    def _wait_ready(self, timeout_s: float = 540) -> float:
        from weightcache.wire.rankfiles import RankFiles

        files = RankFiles(self.socket_dir, self.name, 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited {self.proc.returncode}:\n{self.log.read_text()[-5000:]}")
            info = files.read_ready()
            if info is not None and info.started_at >= self.launched:
                return time.perf_counter() - self.started
            time.sleep(0.25)
        raise RuntimeError(f"daemon not ready in {timeout_s} s:\n{self.log.read_text()[-5000:]}")

    def status(self) -> Any:
        from weightcache.client.weights import DaemonConnection
        from weightcache.wire.rankfiles import RankFiles

        with DaemonConnection(RankFiles(self.socket_dir, self.name, 0).socket) as conn:
            return conn.status()

    def cache(self) -> dict[str, Any]:
        return {"name": self.name, "socket_dir": self.socket_dir, "fallback": "error"}


def start_keeper(socket_dir: str, log: Path) -> subprocess.Popen[bytes]:
    from weightcache.daemon.keeper import KeeperClient, keeper_socket
    from weightcache_contract.errors import CacheUnavailable

    proc = subprocess.Popen(
        [sys.executable, "-m", "weightcache", "keeper", *KeeperArgs(socket_dir=socket_dir).to_argv()],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with KeeperClient(keeper_socket(socket_dir), timeout_s=1) as keeper:
                keeper.ping()
            return proc
        except CacheUnavailable:
            time.sleep(0.2)
    raise SystemExit(f"keeper did not answer:\n{log.read_text()}")


def stop_children(signum: int, _frame: object) -> None:
    """On SIGTERM (``timeout``): SIGKILL every child's process group (engines, daemons, keeper; each
    started in a session of its own), so nothing holds the GPU after this script, then exit through
    the script's ``finally`` blocks. Installed by each benchmark's ``main``."""
    me = os.getpid()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid, ppid = int(stat.parent.name), int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == me:
                os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass
    print(f"signal {signum}: stopped every child", flush=True)
    raise SystemExit(128 + signum)


def checkpoint(workdir: Path, kind: str, gib: float) -> Path:
    """Generated on the GPU (seeded random weights, a real config and tokenizer)."""
    from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint

    if kind == "smoke":
        spec = ModelSpec(
            family="qwen3",
            hidden_size=256,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=512,
            max_position_embeddings=4096,
        )
    elif kind == "dense":
        # Qwen3-8B's widths: per layer 4096·(2·4096 + 2·1024) + 3·4096·12288 ≈ 193 M parameters.
        layers = max(2, round((gib * 2**30 / 2 - 2 * 151936 * 4096) / 193.0e6))
        spec = ModelSpec(
            family="qwen3",
            hidden_size=4096,
            intermediate_size=12288,
            num_layers=layers,
            num_heads=32,
            num_kv_heads=8,
            vocab_size=151936,
            max_position_embeddings=4096,
            shards=8,
        )
    elif kind == "moe":  # block-FP8 experts and attention (weights float8_e4m3fn, one fp32 scale per 128×128 block)
        spec = ModelSpec(
            family="qwen3_moe",
            hidden_size=1024,
            intermediate_size=3072,
            num_layers=4,
            num_heads=16,
            num_kv_heads=4,
            vocab_size=32000,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=512,
            max_position_embeddings=4096,
            fp8=True,
            shards=2,
        )
    else:  # moe-large: Qwen3-235B-A22B's widths (128 experts of 1536, top 8), block FP8, as many layers as fit gib
        per_layer = 128 * 3 * 4096 * 1536 + 2 * 4096 * 4096 + 2 * 4096 * 512  # FP8 bytes (scales: 1/16384 more)
        spec = ModelSpec(
            family="qwen3_moe",
            hidden_size=4096,
            intermediate_size=12288,
            num_layers=max(1, round((gib * 2**30 - 2 * 32768 * 4096 * 2) / per_layer)),
            num_heads=32,
            num_kv_heads=4,
            vocab_size=32768,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1536,
            max_position_embeddings=4096,
            fp8=True,
            shards=max(2, round(gib / 4)),
        )
    out = workdir / f"{kind}-{spec.num_layers}l"
    if not (out / "weightcache-sample.json").exists():
        write_checkpoint(out, spec, device="cpu" if DRY_RUN else "cuda")
        if not DRY_RUN:
            import torch

            torch.cuda.empty_cache()  # the generator's blocks, not held beside the engines
        # The checkpoint's pages written back before any start is timed, so the first start does
        # not share the disk with the kernel's writeback of tens of GB.
        t0 = time.perf_counter()
        os.sync()
        print(f"checkpoint written back to disk in {time.perf_counter() - t0:.1f} s", flush=True)
    return out


def table(rows: list[dict[str, Any]], arena_bytes: int | None) -> None:
    same = len({json.dumps(r["tokens"]) for r in rows}) == 1
    print("\n| start | weight phase (s) | to /health (s) | to first token (s) | GPU memory the engine adds (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        phase = "—" if r["weights_phase_s"] is None else f"{r['weights_phase_s']:.3f}"
        print(
            f"| {r['start']} | {phase} | {r['to_health_s']:.1f} | {r['to_first_token_s']:.1f} | {r['engine_adds_mib']} |"
        )
    if arena_bytes is not None:
        print(f"\ndaemon's arena: {arena_bytes / 2**20:.0f} MiB")
    print(f"greedy tokens identical in every row: {same}")
    if not same:
        for r in rows:
            print(f"  {r['start']}: {r['tokens']}")
