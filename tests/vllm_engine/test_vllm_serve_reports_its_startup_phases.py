"""``vllm serve --load-format weightcache`` as the operator runs it (an API server process and an
engine core process, vLLM's multiprocessing on) reports its startup in the reference engine's
phases: one ``startup rank=… phase=… seconds=…`` line per phase in its log, every one counted from
the API server's start, in order, and the same seconds as ``weightcache_engine_startup_seconds`` on
vLLM's own /metrics."""

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
from pathlib import Path

from vllm_harness import ROOT, cache_config, env, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.engine.timeline import PHASES

LINE = re.compile(r"^(?:\((\w+) pid=(\d+)\) )?.*startup rank=(\d+) phase=(\w+) seconds=([\d.]+)$")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def test_vllm_serve_logs_and_exports_each_startup_phase_from_the_api_server_s_start(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    args = vllm_args()
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", args, logs=tmp_path)
    log = tmp_path / "serve.log"
    port = free_port()
    # The operator's environment for a vLLM engine on CPU (render/vllm.py): multiprocessing stays on.
    serve_env = {k: v for k, v in env(1).items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    serve_env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
    for inherited in ("WEIGHTCACHE_ENGINE_STARTED_AT", "WEIGHTCACHE_ENGINE_STARTUP_DIR"):
        serve_env.pop(inherited, None)
    try:
        daemon.wait_ready()
        with log.open("w") as out:
            serve = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "vllm.entrypoints.cli.main",
                    "serve",
                    str(model),
                    *args,
                    "--load-format",
                    "weightcache",
                    "--model-loader-extra-config",
                    json.dumps(cache_config(daemon)),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                ],
                env=serve_env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            deadline = time.monotonic() + 300
            while get(f"http://127.0.0.1:{port}/health")[0] != 200:
                assert serve.poll() is None, log.read_text()[-6000:]
                assert time.monotonic() < deadline, log.read_text()[-6000:]
                time.sleep(0.5)
            status, metrics = get(f"http://127.0.0.1:{port}/metrics")
        finally:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=120)
    finally:
        daemon.stop()

    text = log.read_text()
    assert "loading from disk" not in text, text[-6000:]
    marks = [m.groups() for m in map(LINE.match, text.splitlines()) if m]
    print(
        "\n".join(
            f"{who or '-'} {pid or '-'} rank {rank} {phase} {seconds}" for who, pid, rank, phase, seconds in marks
        )
    )
    seconds = {phase: float(s) for _who, _pid, _rank, phase, s in marks}
    phases = [phase for _w, _p, _r, phase, _s in marks]
    assert len(phases) == len(set(phases)), f"each phase once: {marks}"
    # In order of their ends; --enforce-eager: vLLM neither compiles nor captures graphs, and says nothing of either.
    assert sorted(phases, key=seconds.__getitem__) == [p for p in PHASES if p != "compile"], marks
    # The API server (imports, ready), the engine core and its worker (the rest): several processes, one clock.
    processes = {phase: (who, pid) for who, pid, _r, phase, _s in marks}
    assert processes["imports"] == processes["ready"] and processes["weights_bound"] != processes["ready"], processes
    assert seconds["imports"] > 0.5, "counted from the API server's process start, not from the plug-in's first call"
    assert status == 200
    for phase, value in seconds.items():
        exported = re.search(
            rf'^weightcache_engine_startup_seconds{{phase="{phase}",rank="0"}} ([\d.e+-]+)$', metrics, re.M
        )
        assert exported is not None and abs(float(exported.group(1)) - value) < 0.001, (phase, metrics[:3000])
