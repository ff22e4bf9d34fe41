"""Steady client load through a Service (usually a ServiceProxy's address), as a client that
retries a failed request once would send it: what the rollout tests and benchmarks count."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field

PROMPT = {"prompt": "The weight cache", "max_tokens": 4, "temperature": 0}


@dataclass
class LoadResult:
    sent: int = 0
    ok: int = 0
    retried: int = 0
    """Requests whose first attempt failed and whose retry succeeded."""
    failed: list[str] = field(default_factory=list)
    """Requests that failed twice, with the second error."""


class SteadyLoad:
    """One request at a time, back to back (``pause_s`` apart), from a thread until ``stop``."""

    def __init__(self, host: str, port: int, timeout_s: float = 30.0, pause_s: float = 0.02) -> None:
        self.url = f"http://{host}:{port}/v1/completions"
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self.result = LoadResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="steady-load")

    def start(self) -> SteadyLoad:
        self._thread.start()
        return self

    def stop(self) -> LoadResult:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s * 2 + 5)
        return self.result

    def _run(self) -> None:
        while not self._stop.is_set():
            self.result.sent += 1
            try:
                self._one()
                self.result.ok += 1
            except (OSError, ValueError):
                try:
                    self._one()
                    self.result.ok += 1
                    self.result.retried += 1
                except (OSError, ValueError) as error:
                    self.result.failed.append(f"{time.strftime('%H:%M:%S')} {error}")
            time.sleep(self.pause_s)

    def _one(self) -> None:
        request = urllib.request.Request(self.url, data=json.dumps(PROMPT).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            body = json.loads(response.read())
        if not body.get("choices"):
            raise OSError(f"no choices in {body}")
