"""Run ``weightcache engine`` as a real process and talk to it over real HTTP (stdlib only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcache.engine.launcher import free_port


@dataclass
class Reply:
    status: int
    body: Any


def request(
    port: int, method: str, path: str, body: Any = None, raw: bytes | None = None, timeout: float = 60
) -> Reply:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            status = resp.status
    except urllib.error.HTTPError as exc:
        text, status = exc.read().decode(), exc.code
    try:
        return Reply(status, json.loads(text))
    except ValueError:
        return Reply(status, text)


def stream_events(port: int, path: str, body: dict[str, Any], timeout: float = 60) -> Iterator[Any]:
    """POST with stream: true; yields the decoded ``data:`` events as they arrive, ``"[DONE]"`` included."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps({**body, "stream": True}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp:
            line = line.decode().strip()
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                yield payload if payload == "[DONE]" else json.loads(payload)


def stream(port: int, path: str, body: dict[str, Any], timeout: float = 60) -> list[Any]:
    return list(stream_events(port, path, body, timeout))


@dataclass
class Engine:
    proc: subprocess.Popen[str]
    port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()

    def get(self, path: str) -> Reply:
        return request(self.port, "GET", path)

    def post(self, path: str, body: Any) -> Reply:
        return request(self.port, "POST", path, body)

    def complete(self, prompt: Any, **kwargs: Any) -> dict[str, Any]:
        reply = self.post("/v1/completions", {"prompt": prompt, "temperature": 0, "return_token_ids": True, **kwargs})
        assert reply.status == 200, reply.body
        return reply.body

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"engine exited {self.proc.returncode}:\n{self.output()}")
            try:
                if self.get("/ready").status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"engine not ready in {timeout} s:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)


class EngineFactory:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.engines: list[Engine] = []

    def __call__(
        self, model: Path, *args: str, wait: bool = True, env: dict[str, str] | None = None, port: int | None = None
    ) -> Engine:
        port = port or free_port()
        log = self.log_dir / f"engine-{len(self.engines)}-{port}.log"
        argv = [sys.executable, "-m", "weightcache", "engine", "--model", str(model), "--port", str(port), *args]
        proc = subprocess.Popen(
            argv,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
        engine = Engine(proc, port, log)
        self.engines.append(engine)
        if wait:
            engine.wait_ready()
        return engine

    def close(self) -> None:
        for e in self.engines:
            if e.proc.poll() is None:
                try:
                    os.killpg(e.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                e.proc.wait()


def engines(log_dir: Path) -> Iterator[EngineFactory]:
    factory = EngineFactory(log_dir)
    try:
        yield factory
    finally:
        factory.close()
