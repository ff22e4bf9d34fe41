"""Startup, readiness and liveness probes (exec, httpGet, tcpSocket) with kubelet semantics."""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..netns import entered
from ..rest import Object


@dataclass(frozen=True)
class ProbeTarget:
    """Where a probe reaches its container."""

    pod_ip: str
    ports: dict[str, int]
    pid: int
    environment: dict[str, str]
    isolated: bool
    netns: str | None = None


def probe_once(probe: Object, target: ProbeTarget) -> tuple[bool, str]:
    """Probes from the node's network, as the node's kubelet does."""
    with entered(target.netns):
        return _probe_once(probe, target)


def _probe_once(probe: Object, target: ProbeTarget) -> tuple[bool, str]:
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "exec" in probe:
            command = list(probe["exec"]["command"])
            if target.isolated:
                # Enter the container's mount namespace so the command sees its volumes.
                command = ["nsenter", "--target", str(target.pid), "--mount", "--", *command]
            result = subprocess.run(command, env=target.environment, capture_output=True, timeout=timeout)
            return result.returncode == 0, f"exit {result.returncode}: {result.stdout[-200:]!r}"
        if "httpGet" in probe:
            action = probe["httpGet"]
            host, port = action.get("host") or target.pod_ip, _port(action["port"], target)
            if action.get("scheme", "HTTP").upper() == "HTTPS":
                connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                    host, port, timeout=timeout, context=ssl._create_unverified_context()
                )
            else:
                connection = http.client.HTTPConnection(host, port, timeout=timeout)
            headers = {h["name"]: h["value"] for h in action.get("httpHeaders", []) or []}
            try:
                connection.request("GET", action.get("path", "/"), headers=headers)
                status = connection.getresponse().status
            finally:
                connection.close()
            return 200 <= status < 400, f"HTTP {status}"
        if "tcpSocket" in probe:
            action = probe["tcpSocket"]
            host, port = action.get("host") or target.pod_ip, _port(action["port"], target)
            socket.create_connection((host, port), timeout=timeout).close()
            return True, "connected"
        return False, f"unsupported probe handler {sorted(probe)}"
    except subprocess.TimeoutExpired:
        return False, f"timed out after {timeout}s"
    except OSError as error:
        return False, str(error)


def _port(port: int | str, target: ProbeTarget) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    return target.ports[str(port)]


class ProbeLoop:
    """Runs one probe on its period and reports threshold crossings, not every result.

    ``on_result(True)`` after successThreshold consecutive successes, ``on_result(False)``
    after failureThreshold consecutive failures, each only when the verdict changes (liveness
    and startup failures are reported every time the threshold is reached again).
    """

    def __init__(self, kind: str, probe: Object, target: ProbeTarget, on_result: Callable[[bool, str], None]) -> None:
        self.kind = kind
        self.probe = probe
        self.target = target
        self.on_result = on_result
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"probe-{kind}")

    def start(self) -> ProbeLoop:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = float(self.probe.get("periodSeconds", 10))
        success_threshold = int(self.probe.get("successThreshold", 1))
        failure_threshold = int(self.probe.get("failureThreshold", 3))
        if self._stop.wait(float(self.probe.get("initialDelaySeconds", 0))):
            return
        successes = failures = 0
        verdict: bool | None = None
        while not self._stop.is_set():
            ok, message = probe_once(self.probe, self.target)
            if self._stop.is_set():
                return
            if ok:
                successes, failures = successes + 1, 0
                if successes >= success_threshold and verdict is not True:
                    verdict = True
                    self.on_result(True, message)
            else:
                failures, successes = failures + 1, 0
                if failures >= failure_threshold and (verdict is not False or self.kind != "readiness"):
                    verdict = False
                    failures = 0
                    self.on_result(False, message)
            if self._stop.wait(period):
                return
