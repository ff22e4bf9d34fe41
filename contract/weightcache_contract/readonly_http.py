"""A tiny read-only HTTP server: fixed GET routes, everything else refused.

Serves the daemon pod's status endpoint and the operator's metrics, so both answer the same way:
GET on a known path is 200 (or the status its route chose: a readiness route answers 503), an
unknown path 404 naming the known ones, any other method 405.
Nothing a request carries is acted on, so there is nothing to write. A plain route ignores the
query string; a queried route (``queried``) gets its parameters, each named once, and answers
400 naming what is wrong with them (``BadRequest``): the daemon's long poll of ``/status``.
Standard library only: the operator imports this without torch.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

from .errors import WeightCacheError

log = logging.getLogger("weightcache.http")

PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
Route = Callable[[], "tuple[str, bytes] | tuple[str, bytes, HTTPStatus]"]
"""Produces (content type, body) for one GET, answered 200, or (content type, body, status)."""


class BadRequest(ValueError):
    """A queried route's parameters it cannot act on: answered 400 with this message."""


@dataclass(frozen=True)
class Reply:
    """A queried route's answer."""

    content_type: str
    body: bytes
    status: HTTPStatus = HTTPStatus.OK
    headers: Mapping[str, str] = field(default_factory=dict)


Queried = Callable[[Mapping[str, str]], Reply]
"""Produces the answer to one GET from its query parameters (name → value, each named once)."""


def parse_addr(text: str, flag: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) → (host, port); a clear error naming ``flag`` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise WeightCacheError(f"{flag} {text!r} is not HOST:PORT (e.g. 0.0.0.0:9400 or [::]:9400)")
    return host.strip("[]"), int(port)


class ReadOnlyServer:
    """Binds at construction (a taken port fails before anything else starts), serves on a thread."""

    def __init__(
        self,
        addr: tuple[str, int],
        routes: Mapping[str, Route],
        what: str,
        queried: Mapping[str, Queried] | None = None,
    ) -> None:
        handler = type("Handler", (_Handler,), {"routes": dict(routes), "queried": dict(queried or {})})
        try:
            self._server = ThreadingHTTPServer(addr, handler)
        except OSError as exc:
            raise WeightCacheError(f"{what} cannot listen on {addr[0]}:{addr[1]}: {exc.strerror or exc}") from None
        self._server.daemon_threads = True
        self.what = what
        self._thread = threading.Thread(target=self._server.serve_forever, name=what, daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()
        log.info("listening", extra={"fields": {"server": self.what, "addr": f"{self.address[0]}:{self.address[1]}"}})

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    routes: dict[str, Route]
    queried: dict[str, Queried]
    timeout = 10  # a client that sends nothing does not pin a thread
    server_version = "weightcache"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        parts = urlsplit(self.path)
        path = parts.path
        if path in self.queried:
            try:
                reply = self.queried[path](_parameters(parts.query))
            except BadRequest as bad:
                self._error(HTTPStatus.BAD_REQUEST, f"GET {path}: {bad}")
                return
            self._send(reply.status, reply.content_type, reply.body, headers=reply.headers)
            return
        route = self.routes.get(path)
        if route is None:
            known = " and ".join(f"GET {p}" for p in sorted({*self.routes, *self.queried}))
            self._error(HTTPStatus.NOT_FOUND, f"no such path {path!r}; this endpoint serves {known}")
            return
        content_type, body, *status = route()
        self._send(status[0] if status else HTTPStatus.OK, content_type, body)

    def _refuse(self) -> None:
        # Drain a small body so the client reads the 405 instead of a reset; never a large one.
        length = self.headers.get("Content-Length", "0")
        if length.isdigit() and int(length) <= 65536:
            self.rfile.read(int(length))
        self.close_connection = True
        self._error(
            HTTPStatus.METHOD_NOT_ALLOWED,
            f"{self.command} is not allowed: this endpoint is read-only (GET)",
            allow="GET",
        )

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _refuse  # noqa: N815

    def _error(self, code: HTTPStatus, message: str, allow: str | None = None) -> None:
        self._send(code, "application/json", json.dumps({"error": message}).encode(), allow)

    def _send(
        self,
        code: HTTPStatus,
        content_type: str,
        body: bytes,
        allow: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow:
            self.send_header("Allow", allow)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        log.debug("http " + format % args)


def _parameters(query: str) -> dict[str, str]:
    """The query string as name → value; a malformed pair or a name given twice is a ``BadRequest``."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=16)
    except ValueError as exc:
        raise BadRequest(f"the query string {query[:100]!r} is not name=value pairs joined by '&' ({exc})") from None
    found: dict[str, str] = {}
    for name, value in pairs:
        if name in found:
            raise BadRequest(f"the query parameter {name!r} is given twice; give it once")
        found[name] = value
    return found
