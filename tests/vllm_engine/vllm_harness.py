"""vLLM-profile daemons and vLLM engines as real processes, one vLLM engine at a time.

The daemon is started exactly as the operator renders it (``weightcache daemon --profile vllm
--engine-args '<JSON>' ... --ranks 0-N``) and the engine gets the same list of vLLM arguments."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint
from weightcache.vllm.loader import WRITTEN_IN_PLACE
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import LOAD_FORMAT, VLLM_PROFILE, DaemonArgs

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [[1, 17, 300, 42, 9], [5, 6, 7, 8, 9, 10, 11, 12], [900, 3]]
MAX_TOKENS = 12


def vllm_args(tp: int = 1, dtype: str = "bfloat16") -> list[str]:
    """What the operator would render for a tiny model on this CPU (one list for daemon and engine)."""
    return [
        "--dtype",
        dtype,
        "--tensor-parallel-size",
        str(tp),
        "--max-model-len",
        "256",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(64 * 2**20),
    ]


def env(tp: int = 1, **extra: str) -> dict[str, str]:
    path = os.pathsep.join(str(ROOT / part) for part in ("contract", "daemon_image", "operator"))
    return {
        **os.environ,
        "PYTHONPATH": path,
        "VLLM_HOST_IP": "127.0.0.1",  # else vLLM's message queue binds a non-loopback address
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model(zero_copy_report)
        # TP=1 in one process (1.8 s instead of 15 s to construct); TP=2 one core per worker.
        **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if tp == 1 else {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}),
        **extra,
    }


def qwen3_checkpoint(out: Path, tie: bool = False, **sizes: int) -> Path:
    """A tiny Qwen3 whose head size vLLM's CPU attention supports (64).

    Tied: the generated embedding (std 1) is scaled to std 0.02, as trained tied embeddings are
    small. At std 1 the residual stream is dominated by the input token's own row, so the nearest
    row of the (tied) lm_head is the input's and greedy output repeats one token, which would
    prove little about the binding of lm_head. ``sizes`` override ModelSpec's (keep the head size
    hidden_size / num_heads at 64)."""
    shape = {"hidden_size": 256, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 512, **sizes}
    path = write_checkpoint(
        out,
        ModelSpec(family="qwen3", tie_word_embeddings=tie, dtype="bfloat16", **shape),  # type: ignore[arg-type]
    )
    if tie:
        _scale_tensor(path, "model.embed_tokens.weight", 0.02)
    return path


def _scale_tensor(checkpoint: Path, name: str, factor: float) -> None:
    from safetensors.torch import load_file, save_file

    for shard in sorted(checkpoint.glob("*.safetensors")):
        tensors = load_file(shard)
        if name in tensors:
            tensors[name] = (tensors[name].float() * factor).to(tensors[name].dtype)
            save_file(tensors, shard, metadata={"format": "pt"})
            return
    raise AssertionError(f"{name} is in no shard of {checkpoint}")


def qwen3_moe_checkpoint(out: Path, fp8: bool = False) -> Path:
    """A tiny Qwen3-MoE: 8 experts, top-2, every layer sparse; ``fp8``: its matrices in block FP8, as a
    pre-quantized checkpoint stores them."""
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
            dtype="bfloat16",
            fp8=fp8,
        ),
    )


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket_dir: Path
    name: str
    ranks: int
    log: Path
    launched: float  # time.time() at start

    def files(self, rank: int) -> RankFiles:
        return RankFiles(self.socket_dir, self.name, rank)

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while not all(self._serving(r) for r in range(self.ranks)):
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-6000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"daemon not ready within {timeout_s} s:\n{self.log.read_text()[-6000:]}")
            time.sleep(0.5)

    def _serving(self, rank: int) -> bool:
        """The rank's ready file was written by this daemon: a SIGKILLed one's file stays behind
        until its successor claims the rank (and its pid may still exist, as a zombie)."""
        info = self.files(rank).read_ready()
        return info is not None and info.started_at >= self.launched

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=120)


def start_daemon(
    model: Path,
    socket_dir: Path,
    name: str,
    args: list[str],
    *,
    logs: Path,
    tp: int = 1,
    profile: str = VLLM_PROFILE,
    **launch: Any,
) -> Daemon:
    """``weightcache daemon --profile vllm`` for all ``tp`` ranks (the launcher); not waited for.

    Its output goes to a new file in ``logs`` (the test's temporary directory). ``args``: its
    ``--engine-args``; ``profile=REFERENCE_PROFILE`` starts the reference profile instead (``args``
    unused); ``launch``: further ``DaemonArgs`` fields."""
    log = logs / f"daemon-{name}-{time.monotonic_ns()}.log"
    daemon = DaemonArgs(
        model=str(model),
        name=name,
        socket_dir=str(socket_dir),
        backend="cpu-shm",
        tp_size=tp,
        ranks=tuple(range(tp)),
        profile=profile,
        engine_args=tuple(args) if profile == VLLM_PROFILE else None,
        **launch,
    )
    cmd = [sys.executable, "-m", "weightcache", "daemon", *daemon.to_argv()]
    launched = time.time()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd,
            env=env(tp, VLLM_CPU_OMP_THREADS_BIND="nobind"),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Daemon(proc, socket_dir, name, tp, log, launched)


class Engine:
    """A running vLLM engine process (engine_process.py) answering greedy requests."""

    def __init__(
        self,
        model: Path,
        args: list[str],
        *,
        tp: int = 1,
        cache: dict | None = None,
        log: Path | None = None,
        gemm: str = "default",
    ) -> None:
        cmd = [sys.executable, str(ROOT / "tests" / "vllm_engine" / "engine_process.py"), str(model), json.dumps(args)]
        cmd += ["--gemm", gemm]
        if cache is not None:
            cmd += ["--load-format", LOAD_FORMAT, "--extra", json.dumps(cache)]
        self.log = log
        # vLLM logs to stdout (the plug-in's lines through vLLM's handler too), where the protocol's
        # lines also go: everything else read from stdout is copied into the log beside stderr.
        self._sink = log.open("w") if log is not None else None
        self.proc = subprocess.Popen(
            cmd,
            env=env(tp),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._sink,
            text=True,
            start_new_session=True,
        )
        try:
            self._expect("READY")
        except BaseException:
            self.close()
            raise

    def _expect(self, prefix: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(prefix):
                return line.removeprefix(prefix).strip()
            self._keep(line)
        where = self.log.read_text()[-6000:] if self.log is not None else "(its log is above)"
        raise RuntimeError(f"vLLM engine exited with {self.proc.wait()}: {where}")

    def request(self, body: dict) -> object:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(body) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("RESULT "))

    def generate(self, prompts: list[list[int]] = PROMPTS, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
        return self.request({"prompts": prompts, "max_tokens": max_tokens})  # type: ignore[return-value]

    def report(self) -> list[dict]:
        return self.request({"report": True})  # type: ignore[return-value]

    def _keep(self, line: str) -> None:
        if self._sink is not None:
            self._sink.write(line)
            self._sink.flush()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        # What it logs while shutting down is read as it comes (a full pipe would block its exit).
        drain = threading.Thread(target=lambda: [self._keep(line) for line in self.proc.stdout or []], daemon=True)
        drain.start()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        drain.join(timeout=10)
        if self._sink is not None:
            self._sink.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def cache_config(daemon: Daemon, fallback: str = "error") -> dict:
    return {"name": daemon.name, "socket_dir": str(daemon.socket_dir), "fallback": fallback}


def from_disk(model: Path, args: list[str], tp: int = 1, gemm: str = "plain") -> list[list[int]]:
    """Greedy ids from vLLM's default loader (``--load-format auto``, untouched weights). ``gemm``:
    ``plain`` computes as an engine from the cache does (F.linear: what a comparison of the weights
    needs; on a CPU with AVX-512 BF16 or AMX, vLLM's oneDNN kernels round bf16 otherwise and a tiny
    random model's near-tie can flip a token), ``default`` as vLLM would."""
    with Engine(model, args, tp=tp, gemm=gemm) as engine:
        assert [r["mode"] for r in engine.report()] == ["disk"] * tp
        return engine.generate()


def assert_zero_copy(reports: list[dict], tp: int) -> None:
    """Every rank maps its weights: all bytes inside the mapping but the in-place attention scalars."""
    assert [r["mode"] for r in reports] == ["cache"] * tp, reports
    for rank in reports:
        assert rank["tensors"] > 0
        assert {name.rpartition(".")[2] for name in rank["outside"]} <= WRITTEN_IN_PLACE, rank["outside"]


def assert_cache_matches_disk(
    tmp_path: Path, model: Path, args: list[str], name: str, tp: int = 1, gemm: str = "plain"
) -> list[dict]:
    """vLLM from a ``vllm``-profile daemon gives vLLM-from-disk's greedy ids (``gemm``: as in
    ``from_disk``) with zero copies on every rank; returns the ranks' reports for what a scenario
    checks beyond that."""
    expected = from_disk(model, args, tp=tp, gemm=gemm)
    daemon = start_daemon(model, tmp_path / "sockets", name, args, logs=tmp_path, tp=tp)
    try:
        daemon.wait_ready()
        with Engine(model, args, tp=tp, cache=cache_config(daemon)) as engine:
            assert engine.generate() == expected
            reports = engine.report()
            assert_zero_copy(reports, tp=tp)
            return reports
    finally:
        daemon.stop()
