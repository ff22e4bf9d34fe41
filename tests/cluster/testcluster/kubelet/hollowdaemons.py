"""The status endpoints of every hollow daemon pod, answered by one thread (a control-plane
simulation: no daemon runs behind them).

A weightcache daemon pod serves ``GET /status`` (the ``DaemonReport`` the operator reads,
contract/weightcache_contract/daemon_report.py) and ``GET /ready`` (its readiness probe) on its
pod IP at the container port named ``status``. For a hollow pod the same two paths are served
from one asyncio loop holding one listening socket per pod, so hundreds of hollow daemons cost
one thread. What they report is what the test sets per node (``HollowDaemonState``): ready,
loading or failed, and the host's free memory.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import hashlib
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from weightcache_contract.launch import DaemonArgs, add_daemon_arguments

log = logging.getLogger(__name__)

Health = Literal["ready", "loading", "failed"]
HOST_TOTAL_BYTES = 32 << 30


@dataclass(frozen=True)
class HollowDaemonState:
    health: Health = "ready"
    free_bytes: int = 24 << 30

    @property
    def ready(self) -> bool:
        return self.health == "ready"


@dataclass(frozen=True)
class HollowDaemon:
    """What a hollow daemon pod's endpoint needs to know of the pod."""

    cache: str
    ranks: list[int]


def daemon_of(pod: dict[str, Any]) -> HollowDaemon | None:
    """The cache and local ranks a rendered daemon pod's command names (``--name``, ``--ranks``),
    read with the daemon's own flags; None for a pod that is not a daemon."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        command = [*(container.get("command") or []), *(container.get("args") or [])]
        if "daemon" in command and "--name" in command and "--ranks" in command:
            break
    else:
        return None
    parser = argparse.ArgumentParser(prog="weightcache daemon")
    add_daemon_arguments(parser, socket_dir="")
    daemon = DaemonArgs.from_namespace(parser.parse_args(command[command.index("daemon") + 1 :]))
    return HollowDaemon(daemon.name, list(daemon.ranks or ()))


def report(daemon: HollowDaemon, state: HollowDaemonState) -> dict[str, Any]:
    """The ``DaemonReport`` JSON for ``state`` (the contract's field names; checked by a unit test)."""
    problem = None if state.ready else ("loading weights" if state.health == "loading" else "exited with code 1")
    ranks = []
    for rank in daemon.ranks:
        entry: dict[str, Any] = {"rank": rank, "ready": state.ready, "problem": problem}
        if state.ready:
            digest = hashlib.sha256(f"{daemon.cache}/{rank}".encode()).hexdigest()
            entry.update(backend="cpu-shm", bytes=1 << 20, tensor_count=1, source="disk", fingerprint=digest)
        ranks.append(entry)
    fingerprint = hashlib.sha256(daemon.cache.encode()).hexdigest() if state.ready else None
    memory = [{"device": "host", "total_bytes": HOST_TOTAL_BYTES, "free_bytes": state.free_bytes}]
    return {
        "version": 1,
        "cache": daemon.cache,
        "ready": state.ready,
        "fingerprint": fingerprint,
        "ranks": ranks,
        "memory": memory,
    }


class HollowDaemonServer:
    """One thread, one event loop, one listening socket per hollow daemon pod."""

    def __init__(self, state_of: Callable[[str], HollowDaemonState]) -> None:
        self._state_of = state_of  # node → what its daemons say now
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="hollow-daemons")
        self._servers: dict[str, concurrent.futures.Future[asyncio.Server]] = {}
        self.requests = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        for key in list(self._servers):
            self.close(key)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def serve(self, key: str, ip: str, port: int, node: str, daemon: HollowDaemon) -> None:
        """Answers for the pod ``key`` on ``ip:port`` until ``close(key)``."""

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                line = await reader.readline()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                self.requests += 1
                path = line.split(b" ")[1].decode() if line.count(b" ") >= 2 else ""
                state = self._state_of(node)
                if path == "/status":
                    code, body = 200, json.dumps(report(daemon, state)).encode()
                elif path == "/ready":
                    code, body = (200, b"ok") if state.ready else (503, state.health.encode())
                else:
                    code, body = 404, b"not found"
                reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
                writer.write(
                    f"HTTP/1.1 {code} {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
            except (ConnectionError, IndexError):
                pass
            finally:
                writer.close()

        async def start() -> asyncio.Server:
            return await asyncio.start_server(handle, ip, port, reuse_address=True)

        # Not waited for: the caller may hold a lock that a request being answered needs.
        started = asyncio.run_coroutine_threadsafe(start(), self._loop)
        started.add_done_callback(
            lambda f: f.exception() and log.error("hollow daemon %s:%s: %s", ip, port, f.exception())
        )
        self._servers[key] = started

    def close(self, key: str) -> None:
        started = self._servers.pop(key, None)
        if started is not None:
            started.add_done_callback(
                lambda f: f.exception() is None and self._loop.call_soon_threadsafe(f.result().close)
            )
