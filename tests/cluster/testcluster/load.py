"""Client load through a Service (usually a ServiceProxy's address), as a client that retries a
failed request once would send it: what the rollout and failover tests, benchmarks and the demo
count. ``SteadyLoad`` sends one request at a time; ``OpenLoopLoad`` starts one every interval
whatever the earlier ones are doing, and keeps every attempt with its times."""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
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
        request = urllib.request.Request(
            self.url, data=json.dumps(PROMPT).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            body = json.loads(response.read())
        if not body.get("choices"):
            raise OSError(f"no choices in {body}")


@dataclass
class Attempt:
    started: float
    ended: float
    ok: bool
    retry: bool
    error: str | None = None
    """Why it failed: ``HTTP <status>``, ``timeout``, or the exception's type."""
    request: int = 0
    """Which request it was an attempt of: a retry has its first attempt's number."""


@dataclass
class OpenLoopLoad:
    """An open-loop client: one request every ``interval`` seconds, each on its own thread with
    its own ``timeout``, retried once after ``retry_delay`` on failure. A request stuck on a
    frozen engine delays no other, so "the first successful request sent after a kill" means
    what it says."""

    address: tuple[str, int]
    interval: float
    retry_delay: float
    timeout: float
    prompt: dict = field(default_factory=lambda: dict(PROMPT))
    attempts: list[Attempt] = field(default_factory=list)
    phases: list[float] = field(default_factory=list)
    """When each group of events began, for callers that count requests per group."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _open: dict[int, float] = field(default_factory=dict)
    """Requests not finished yet (retry included): number → start time."""
    _numbers: itertools.count = field(default_factory=itertools.count)

    def start(self) -> OpenLoopLoad:
        threading.Thread(target=self._run, daemon=True, name="load").start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def done(self) -> list[Attempt]:
        with self._lock:
            return list(self.attempts)

    def settled(self, until: float) -> bool:
        """Whether every request started before ``until`` has finished, its retry included."""
        with self._lock:
            return all(started >= until for started in self._open.values())

    def _one(self, request: int, retry: bool) -> bool:
        started, error = time.time(), None
        try:
            sent = urllib.request.Request(
                f"http://{self.address[0]}:{self.address[1]}/v1/completions",
                data=json.dumps(self.prompt).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(sent, timeout=self.timeout) as response:
                ok = response.status == 200 and bool(json.loads(response.read())["choices"][0]["text"] is not None)
        except urllib.error.HTTPError as failed:
            ok, error = False, f"HTTP {failed.code}"
        except Exception as failed:  # noqa: BLE001 - a failed request is what we count
            timed_out = isinstance(failed, TimeoutError) or isinstance(getattr(failed, "reason", None), TimeoutError)
            ok, error = False, "timeout" if timed_out else type(failed).__name__
        with self._lock:
            self.attempts.append(Attempt(started, time.time(), ok, retry, error, request))
        return ok

    def _request(self) -> None:
        with self._lock:
            number = next(self._numbers)
            self._open[number] = time.time()
        try:
            if not self._one(number, False):
                time.sleep(self.retry_delay)
                self._one(number, True)
        finally:
            with self._lock:
                del self._open[number]

    def _run(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            threading.Thread(target=self._request, daemon=True).start()
            due += self.interval
            self._stop.wait(max(0.0, due - time.monotonic()))
