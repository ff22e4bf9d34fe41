"""The daemon pod's HTTP status endpoint: ``GET /status`` (JSON) and ``GET /metrics`` (Prometheus).

It runs in the launcher (``weightcache daemon --ranks … --status-addr HOST:PORT``), the one
process that knows every local rank and outlives their loads and crashes. It asks each rank over
its Unix socket, exactly as the readiness probe does, so the endpoint, the probe and the rank's
own counters can never disagree about what "ready" means. This is how the operator learns bytes,
GPU UUIDs and fingerprints without the daemon holding any Kubernetes API rights.

Read-only by construction: GET only (anything else is 405), two fixed paths (anything else is
404), nothing in a request reaches a rank but the fixed ``status`` message.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from .daemon_report import DaemonReport, RankReport, node_fingerprint, report_metrics
from .errors import WeightCacheError
from .probe import inspect_rank

log = logging.getLogger("weightcache.status")

RANK_TIMEOUT_S = 1.0
"""Per-rank socket timeout: a stopped or wedged rank costs a scrape this long, not a hang."""

ExitCode = Callable[[int], int | None]
"""rank → its process's exit code, None while it runs (the launcher's record, no syscalls)."""


def parse_addr(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → (host, port); a clear error otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise WeightCacheError(f"--status-addr {text!r} is not HOST:PORT (e.g. 0.0.0.0:9400 or [::]:9400)")
    return host.strip("[]"), int(port)


def collect(socket_dir: str, name: str, ranks: list[int], exit_code: ExitCode,
            timeout_s: float = RANK_TIMEOUT_S) -> DaemonReport:
    """Ask every local rank at once, so a report takes one rank timeout at worst."""

    def one(rank: int) -> RankReport:
        code = exit_code(rank)
        if code is not None:
            return RankReport(rank=rank, ready=False, problem=f"rank {rank}: process exited with code {code}")
        status, problem = inspect_rank(socket_dir, name, rank, timeout_s)
        if status is None:
            return RankReport(rank=rank, ready=False, problem=problem)
        return RankReport(
            rank=rank, ready=problem is None, problem=problem, pid=status.pid, backend=status.backend,
            bytes=status.arena_bytes, tensor_count=status.tensor_count, gpu_uuid=status.device_uuid,
            load_seconds=status.load_seconds, source="keeper" if status.adopted else "disk",
            fingerprint=status.fingerprint_digest, disk_bytes_read=status.disk_bytes_read,
            maps_served=status.fetches_total, connections_total=status.connections_total,
            deposited=status.deposited, uptime_seconds=status.uptime_seconds,
        )  # fmt: skip

    with ThreadPoolExecutor(max_workers=max(1, len(ranks)), thread_name_prefix="status") as pool:
        reports = list(pool.map(one, ranks))
    return DaemonReport(cache=name, ready=bool(reports) and all(r.ready for r in reports),
                        fingerprint=node_fingerprint(reports), ranks=reports)  # fmt: skip


class StatusEndpoint:
    """Binds at construction (so a taken port fails before any rank starts), serves on a thread."""

    def __init__(self, addr: tuple[str, int], report: Callable[[], DaemonReport]) -> None:
        handler = type("Handler", (_Handler,), {"report": staticmethod(report)})
        try:
            self._server = ThreadingHTTPServer(addr, handler)
        except OSError as exc:
            raise WeightCacheError(f"status endpoint cannot listen on {addr[0]}:{addr[1]}: {exc.strerror or exc}; "
                                   "pick another --status-addr") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="status-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()
        log.info("status endpoint listening", extra={"fields": {"addr": "%s:%d" % self.address}})

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    report: Callable[[], DaemonReport]
    timeout = 10  # a client that sends nothing does not pin a thread
    server_version = "weightcache-daemon"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = urlsplit(self.path).path
        if path == "/status":
            self._send(HTTPStatus.OK, "application/json", self.report().model_dump_json(indent=1).encode())
        elif path == "/metrics":
            self._send(HTTPStatus.OK, "text/plain; version=0.0.4; charset=utf-8",
                       report_metrics(self.report()).render().encode())  # fmt: skip
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such path {path!r}; this endpoint serves GET /status and GET /metrics")

    def _refuse(self) -> None:
        # Drain a small body so the client reads the 405 instead of a reset; never a large one.
        length = self.headers.get("Content-Length", "0")
        if length.isdigit() and int(length) <= 65536:
            self.rfile.read(int(length))
        self.close_connection = True
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} is not allowed: the status endpoint is read-only (GET)",
                    allow="GET")  # fmt: skip

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _refuse  # noqa: N815

    def _error(self, code: HTTPStatus, message: str, allow: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self._send(code, "application/json", body, allow)

    def _send(self, code: HTTPStatus, content_type: str, body: bytes, allow: str | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        log.debug("http " + format % args)
