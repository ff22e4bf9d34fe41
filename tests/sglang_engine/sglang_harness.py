"""SGLang-profile daemons and SGLang servers as real processes, on the CPU, in the SGLang test
environment (``make sglang``). The daemon is started as the operator would render it (``weightcache
daemon --profile sglang --engine-args '<JSON>'``) and the server gets the same list of SGLang
arguments after its ``--model-path``: ``python -m sglang.launch_server``, from disk or with
``--load-format weightcache``. Every process gets the kernel stand-in on its path (stand_in/)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import LOAD_FORMAT, SGLANG_PROFILE, DaemonArgs

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = Path(__file__).with_name("stand_in")
CALLS_ENV = "WEIGHTCACHE_SGL_KERNEL_CALLS"
PROMPTS = [[1, 17, 300, 42, 9], [5, 6, 7, 8, 9, 10, 11, 12], [900, 3]]
MAX_TOKENS = 12
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
_BIND_FAILED = b"error while attempting to bind on address"


def sglang_args(tp: int = 1, dtype: str = "bfloat16") -> list[str]:
    """What the operator would render for a tiny model on this CPU (one list for daemon and server)."""
    return ["--device", "cpu", "--dtype", dtype, "--tp-size", str(tp), "--max-total-tokens", "2048"]


def env(calls: Path, tp: int = 1, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(STAND_IN), *(str(ROOT / p) for p in ("contract", "daemon_image", "operator"))])
    parallel = {
        # SGLang's CPU engine binds each rank's OpenMP threads to a NUMA node and refuses more ranks
        # than nodes (this machine has one): one core per rank instead.
        "SGLANG_CPU_OMP_THREADS_BIND": "|".join(str(rank) for rank in range(tp)),
        # torch's CUDA wheel ships NCCL, so SGLang would build a pynccl communicator next to gloo and
        # fail with "Expected a cuda device, but got: cpu"; SGLang's own knob pointed at a missing
        # library disables pynccl (a CPU-only torch has no NCCL and needs neither).
        "SGLANG_NCCL_SO_PATH": "/nonexistent/libnccl.so.2",
    }
    return {
        **os.environ,
        "PYTHONPATH": path,
        "SGLANG_USE_CPU_ENGINE": "1",
        CALLS_ENV: str(calls),
        **(parallel if tp > 1 else {}),
        **extra,
    }


def qwen3_checkpoint(out: Path, **spec: Any) -> Path:
    """A tiny Qwen3 (head size 64); ``spec``: ModelSpec fields to override (``num_kv_heads``, ``seed``)."""
    shape: dict[str, Any] = {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 512}
    return write_checkpoint(out, ModelSpec(family="qwen3", dtype="bfloat16", **{**shape, **spec}))


def qwen3_moe_checkpoint(out: Path) -> Path:
    """A tiny Qwen3-MoE: 8 experts, top-2, every layer sparse, stored in float32 (served so: in
    bf16 SGLang's greedy ids diverge from HF's at a near-tie, in float32 they equal HF's)."""
    return write_checkpoint(
        out,
        ModelSpec(
            family="qwen3_moe",
            hidden_size=256,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=512,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=128,
            dtype="float32",
        ),
    )


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket_dir: Path
    name: str
    log: Path
    launched: float
    ranks: int = 1

    def files(self, rank: int = 0) -> RankFiles:
        return RankFiles(self.socket_dir, self.name, rank)

    def _serving(self, rank: int) -> bool:
        """The rank's ready file was written by this daemon: a SIGKILLed one's stays behind until
        its successor claims the rank."""
        info = self.files(rank).read_ready()
        return info is not None and info.started_at >= self.launched

    def wait_ready(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self._serving(rank) for rank in range(self.ranks)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-6000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"daemon not ready within {timeout_s} s:\n{self.log.read_text()[-6000:]}")
            time.sleep(0.5)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        return self.proc.wait(timeout=120)


def start_daemon(
    model: Path, socket_dir: Path, name: str, args: list[str], *, logs: Path, calls: Path, tp: int = 1, **more: Any
) -> Daemon:
    """``weightcache daemon --profile sglang`` for all ``tp`` ranks (its launcher starts one process
    per rank); not waited for. ``more``: further ``DaemonArgs`` fields."""
    log = logs / f"daemon-{name}-{time.monotonic_ns()}.log"
    launch = DaemonArgs(
        model=str(model),
        name=name,
        socket_dir=str(socket_dir),
        backend="cpu-shm",
        tp_size=tp,
        ranks=tuple(range(tp)),
        profile=SGLANG_PROFILE,
        engine_args=tuple(args),
        **more,
    )
    launched = time.time()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "weightcache", "daemon", *launch.to_argv()],
            env=env(calls, tp),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Daemon(proc, socket_dir, name, log, launched, tp)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``python -m sglang.launch_server`` on a loopback port, from disk or from the cache.

    ``left``, after ``stop``: the names in /dev/shm its processes made and SGLang's teardown left
    (``sglang_loads_*.shm``, at TP>1 a 24 MiB ``sgl_shm_mq_*``), which ``stop`` removes so that test
    runs do not fill /dev/shm."""

    def __init__(
        self, model: Path, args: list[str], *, log: Path, calls: Path, cache: dict[str, Any] | None = None, tp: int = 1
    ):
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), *args]
        # --sleep-on-idle: an idle SGLang scheduler otherwise spins a core, which a test's other
        # SGLang processes (its daemon's ranks, a second server) would wait for (docs/sglang.md).
        self.cmd += ["--host", "127.0.0.1", "--skip-tokenizer-init", "--sleep-on-idle"]
        if cache is not None:
            self.cmd += ["--load-format", LOAD_FORMAT, "--model-loader-extra-config", json.dumps(cache)]
        self.log, self.env = log, env(calls, tp)
        self.shm = ShmHeld().__enter__()
        self.left: list[str] = []
        self._start()

    def _start(self) -> None:
        self.port = free_port()
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.cmd, "--port", str(self.port)],
                env=self.env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.shm.watch(self.proc)

    def wait_healthy(self, timeout_s: float = 300) -> float:
        """Seconds from now until ``/health`` answered 200."""
        started = time.monotonic()
        while True:
            try:
                with _OPENER.open(f"http://127.0.0.1:{self.port}/health", timeout=2) as response:
                    if response.status == 200:
                        return time.monotonic() - started
            except OSError:
                pass
            if _BIND_FAILED in self.log.read_bytes()[self._log_from :]:
                # The port, free when chosen, was taken by another process during SGLang's start
                # (minutes on a busy machine): start again on another one.
                self._end()
                self._start()
                started = time.monotonic()
                continue
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang exited with {self.proc.returncode}:\n{self.log.read_text()[-8000:]}")
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"SGLang not healthy within {timeout_s} s:\n{self.log.read_text()[-8000:]}")
            time.sleep(0.5)

    def generate(self, prompts: list[list[int]] = PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
        """Greedy output token ids, one list per prompt, ``max_tokens`` each (an end of sequence
        does not end a comparison early)."""
        outputs = []
        for ids in prompts:
            body = json.dumps(
                {
                    "input_ids": ids,
                    "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True},
                }
            )
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/generate", body.encode(), {"Content-Type": "application/json"}
            )
            with _OPENER.open(request, timeout=120) as response:
                outputs.append(json.loads(response.read())["output_ids"])
        return outputs

    def stop(self) -> None:
        """SIGTERM to the server's own process, as a container's stop sends it: SGLang stops its
        scheduler and detokenizer itself. What is left of its process group after that (or after 60
        s) is killed, and what it left in /dev/shm removed (``left``)."""
        self._end()
        self.shm.__exit__()
        self.left = sorted({*self.left, *self.shm.left()})
        for name in self.left:
            (SHM / name).unlink(missing_ok=True)

    def _end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


def generated(
    model: Path, args: list[str], *, log: Path, calls: Path, cache: dict[str, Any] | None = None, tp: int = 1
) -> list[list[int]]:
    """A server's greedy outputs for ``PROMPTS``, from its start to its stop."""
    server = Server(model, args, log=log, calls=calls, cache=cache, tp=tp)
    try:
        server.wait_healthy()
        return server.generate()
    finally:
        server.stop()


SHM = Path("/dev/shm")


class ShmHeld:
    """The ``/dev/shm`` names that processes of the given sessions (the harness starts each daemon
    and server in its own) hold open or mapped, sampled every 0.1 s while in use: what those
    processes made there, told apart from what other processes on the machine make concurrently.
    A name made, unlinked and unmapped again within one interval is not seen, nor needed."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.sessions: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ShmHeld:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def watch(self, proc: subprocess.Popen[bytes]) -> None:
        self.sessions.add(proc.pid)  # start_new_session: its session id is its pid
        self._sample()

    def left(self) -> list[str]:
        """The names seen that still exist."""
        return sorted(name for name in self.names if (SHM / name).exists())

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self._sample()

    def _sample(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getsid(int(entry.name)) not in self.sessions:
                    continue
                targets = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
                targets += [line.split(maxsplit=5)[-1] for line in (entry / "maps").read_text().splitlines()]
            except OSError:  # gone meanwhile
                continue
            # A name unlinked while still mapped too: it was made there.
            self.names.update(
                target.removeprefix(f"{SHM}/").removesuffix(" (deleted)")
                for target in targets
                if target.startswith(f"{SHM}/")
            )
