"""``weightcache warm`` beside a real reference engine: ready only once the engine has served a
request through its API, cold again when the engine goes down, warm again after it restarts, and
kept warm on its interval."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import Engine, EngineFactory, engines, request
from testcluster.waiting import wait_for
from weightcache.engine.launcher import free_port
from weightcache_contract.launch import WarmArgs

pytestmark = pytest.mark.slow


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[EngineFactory]:
    yield from engines(tmp_path)


@pytest.fixture
def start_warm(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[str]] = []

    def start(engine_port: int, **changes: object) -> tuple[subprocess.Popen[str], int, Path]:
        port = free_port()
        args = WarmArgs(engine_url=f"http://127.0.0.1:{engine_port}", host="127.0.0.1", port=port).but(**changes)
        log = tmp_path / f"warm-{port}.log"
        proc = subprocess.Popen(
            [sys.executable, "-m", "weightcache", "warm", *args.to_argv()],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        procs.append(proc)
        return proc, port, log

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ready(port: int) -> int:
    try:
        return request(port, "GET", "/ready", timeout=5).status
    except OSError:
        return 0


def status(port: int) -> dict:
    return request(port, "GET", "/status", timeout=5).body


def generated_tokens(engine: Engine) -> float:
    """Tokens the engine generated, by its own /metrics: what says a request really ran."""
    text = str(engine.get("/metrics").body)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("weightcache_engine_generated_tokens_total")
    )


def test_ready_only_after_the_engine_served_cold_when_it_dies_warm_again_after_restart(
    llama: Path, start_engine: EngineFactory, start_warm
) -> None:
    engine_port = free_port()
    warm, port, _ = start_warm(engine_port, health_path="/ready", every=0.0)
    wait_for(lambda: ready(port) == 503, 30, describe="the sidecar answers 503 while no engine runs")
    assert "does not answer" in status(port)["reason"]

    engine = start_engine(llama, "--max-model-len", "128", port=engine_port, wait=False)
    wait_for(lambda: ready(port) == 200, 120, describe=lambda: f"warm: {status(port)}")
    assert engine.get("/ready").status == 200
    assert generated_tokens(engine) >= 1, "ready before the engine generated a token"
    assert status(port)["warmed"] == 1

    engine.stop(signal.SIGKILL)
    wait_for(lambda: ready(port) == 503, 10, describe="cold once the engine is gone")

    again = start_engine(llama, "--max-model-len", "128", port=engine_port, wait=False)
    wait_for(lambda: ready(port) == 200, 120, describe=lambda: f"warm again: {status(port)}")
    assert generated_tokens(again) >= 1
    assert status(port)["warmed"] == 2
    assert warm.poll() is None


def test_keep_warm_sends_the_request_again_on_its_interval(
    llama: Path, start_engine: EngineFactory, start_warm
) -> None:
    engine = start_engine(llama, "--max-model-len", "128")
    _, port, _ = start_warm(engine.port, health_path="/ready", every=0.5)
    wait_for(lambda: status(port)["warmed"] >= 4, 60, describe=lambda: f"keep-warm: {status(port)}")
    assert ready(port) == 200
    assert generated_tokens(engine) >= 4


def test_a_request_the_engine_refuses_keeps_the_pod_cold_and_says_why(
    llama: Path, start_engine: EngineFactory, start_warm
) -> None:
    engine = start_engine(llama, "--max-model-len", "128")
    _, port, _ = start_warm(engine.port, health_path="/ready", request_path="/v1/nothing-here")
    wait_for(lambda: status(port)["failures"] >= 2, 30, describe=lambda: f"failing: {status(port)}")
    assert ready(port) == 503
    assert "HTTP 404" in status(port)["reason"]


def test_a_request_body_that_is_not_json_is_refused_at_start(start_warm) -> None:
    warm, _, log = start_warm(free_port(), request="{not json")
    assert warm.wait(timeout=30) != 0
    assert "--request is not JSON" in log.read_text()
