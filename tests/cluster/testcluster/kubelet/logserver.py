"""The slice of the kubelet's HTTPS API that makes ``kubectl logs`` work: containerLogs.

The API server proxies ``pods/log`` to ``https://<node InternalIP>:<kubeletEndpoint port>``;
each simulated node has its own local InternalIP, so each gets a server on port 10250 there.
exec, attach and port-forward need stream upgrades and are not served (501).
"""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .pods import PodWorker

log = logging.getLogger(__name__)

KUBELET_PORT = 10250

FindWorker = Callable[[str, str], "PodWorker | None"]


class LogServer:
    def __init__(self, address: str, cert: Path, key: Path, find: FindWorker) -> None:
        handler = type("BoundHandler", (_Handler,), {"find": staticmethod(find)})
        self._server = http.server.ThreadingHTTPServer((address, KUBELET_PORT), handler)
        self._server.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name=f"kubelet-api-{address}")

    def start(self) -> LogServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(http.server.BaseHTTPRequestHandler):
    find: FindWorker

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        log.debug("kubelet api: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        if parts == ["healthz"]:
            self._reply(200, b"ok")
            return
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._reply(501, b"the process kubelet serves only /containerLogs")
            return
        _, namespace, pod, container = parts
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        worker = self.find(namespace, pod)
        if worker is None:
            self._reply(404, f"pod {namespace}/{pod} is not on this kubelet".encode())
            return
        path = worker.log_path(container, previous=query.get("previous") == "true")
        if path is None:
            self._reply(400, f"no logs for container {container!r} (previous={query.get('previous')})".encode())
            return
        data = path.read_bytes()
        if "tailLines" in query:
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[-int(query["tailLines"]) :]) if int(query["tailLines"]) else b""
        if "limitBytes" in query:
            data = data[: int(query["limitBytes"])]
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(data)
        if query.get("follow") == "true":
            self._follow(worker, container, path, path.stat().st_size)

    def _follow(self, worker: PodWorker, container: str, path: Path, offset: int) -> None:
        """Streams what the container writes until its process exits, like a real kubelet."""
        runner = next((r for r in [*worker.runners, *worker.init_runners] if r.name == container), None)
        process = runner.process if runner else None
        with open(path, "rb") as file:
            file.seek(offset)
            while True:
                chunk = file.read(65536)
                if chunk:
                    try:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                    except OSError:
                        return
                    continue
                if process is None or process.poll() is not None:
                    return
                time.sleep(0.1)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
