"""``weightcache warm``: the engine pod's sidecar that makes "Ready" mean "has served".

An engine whose weights are mapped and whose health endpoint answers has still never run a
request: its first one pays for what the engine builds lazily (vLLM's first scheduler step and
sampler, tokenizer caches, allocator growth), about a second on this machine's CPU. A standby
promoted in that state answers its first client slowly although its pod said Ready. This sidecar
sends the engine, through its own API, the request a client would (one generated token) once the
engine's health answers, and only then does its ``/ready`` say 200; the pod is Ready when every
container is, so a standby counts as ready to take over only once it has served. Every ``--every``
seconds after that it sends the request again (keep-warm: one token per interval, whatever the
engine's traffic), so an idle standby stays hot.

A failed health check means the engine went down (a crash, a restart): the sidecar is cold again
and warms the engine that comes back before it says ready. Three keep-warm requests failing in a
row make it cold too. It never takes a healthy engine out of the Service on its own otherwise:
the engine's readiness probe judges the engine; this one judges whether it has served since it
came up. Standard library only: it runs in the engine's image, beside the engine, on little memory.
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from weightcache_contract.launch import WARM_REQUEST, WarmArgs, add_warm_arguments

log = logging.getLogger("weightcache.warm")

HEALTH_EVERY_S = 0.5
"""How often the engine's health is checked: an engine restart takes longer than this to answer
again, so the sidecar never misses one."""
HEALTH_TIMEOUT_S = 2.0
RETRY_S = 1.0
"""Seconds between warm attempts of an engine that is up but failed its warm request."""
COLD_AFTER_FAILURES = 3
"""Keep-warm requests failing in a row that make the sidecar cold (so it warms again)."""

# The engine is this pod's: an HTTP(S)_PROXY in the environment must not route the requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_warm_arguments(p)


@dataclass
class Warmth:
    """What the sidecar knows: whether the engine has served since it last came up, and why not."""

    warm: bool = False
    reason: str = "the engine has not answered its health check yet"
    warmed: int = 0
    """Successful warm and keep-warm requests."""
    failures: int = 0
    """Failed warm and keep-warm requests."""
    failing: int = 0
    """Of those, the ones in a row since the last success."""
    last_seconds: float | None = None
    """How long the last successful request took."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict[str, object]:
        with self.lock:
            return {
                "warm": self.warm,
                "reason": self.reason,
                "warmed": self.warmed,
                "failures": self.failures,
                "lastSeconds": self.last_seconds,
            }


class Warmer:
    def __init__(self, args: WarmArgs) -> None:
        self.args = args
        self.base = args.engine_url.rstrip("/")
        self.body = _checked_body(args.request)
        self.state = Warmth()
        self.stop = threading.Event()

    def healthy(self) -> bool:
        try:
            with _OPENER.open(self.base + self.args.health_path, timeout=HEALTH_TIMEOUT_S) as response:
                return bool(response.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def request(self) -> tuple[bool, str, float]:
        """One warm request: (served, why not, seconds). Served means a 2xx answer whose JSON has
        ``choices``: a token was generated, not only accepted."""
        started = time.monotonic()
        post = urllib.request.Request(
            self.base + self.args.request_path,
            data=self.body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with _OPENER.open(post, timeout=self.args.timeout) as response:
                answer = json.loads(response.read(1 << 20) or b"null")
        except urllib.error.HTTPError as error:
            detail = error.read(300).decode(errors="replace")
            return False, f"the warm request got HTTP {error.code}: {detail}", time.monotonic() - started
        except (OSError, ValueError) as error:
            return False, f"the warm request failed: {error}", time.monotonic() - started
        seconds = time.monotonic() - started
        if not isinstance(answer, dict) or not answer.get("choices"):
            return False, f"the warm request's answer has no choices: {str(answer)[:200]}", seconds
        return True, "", seconds

    def step(self, now: float, last_request: float) -> float:
        """One round of the loop; returns when the last request was sent."""
        state = self.state
        if not self.healthy():
            with state.lock:
                if state.warm:
                    log.warning("engine health failed: cold until it answers a request again")
                state.warm, state.reason = False, f"the engine's {self.args.health_path} does not answer 200"
            return last_request
        due = not state.warm or (self.args.every > 0 and now - last_request >= self.args.every)
        retry_wait = not state.warm and now - last_request < RETRY_S
        if not due or retry_wait:
            return last_request
        served, why, seconds = self.request()
        with state.lock:
            if served:
                if not state.warm:
                    log.info("engine served the warm request: ready (%.3f s)", seconds)
                state.warm, state.reason, state.last_seconds = True, "", seconds
                state.warmed += 1
                state.failing = 0
            else:
                state.failures += 1
                state.failing += 1
                log.warning("%s", why)
                if not state.warm or state.failing >= COLD_AFTER_FAILURES:
                    state.warm, state.reason = False, why
        return time.monotonic()

    def run(self) -> None:
        last = float("-inf")
        while not self.stop.is_set():
            last = self.step(time.monotonic(), last)
            self.stop.wait(HEALTH_EVERY_S)


def _checked_body(text: str) -> bytes:
    try:
        body = json.loads(text)
    except ValueError as error:
        raise SystemExit(
            f"weightcache warm: {WARM_REQUEST.flag} is not JSON ({error}); give the body a client would POST"
        ) from None
    if not isinstance(body, dict):
        raise SystemExit(f"weightcache warm: {WARM_REQUEST.flag} must be a JSON object, the body a client would POST")
    return json.dumps(body).encode()


def _handler(state: Warmth) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path not in ("/ready", "/status"):
                self._answer(404, {"error": f"no {self.path}: GET /ready or /status"})
                return
            snapshot = state.snapshot()
            code = 200 if snapshot["warm"] or self.path == "/status" else 503
            self._answer(code, snapshot)

        def _answer(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's name
            return  # probes every second: not worth a log line each

    return Handler


def run(args: argparse.Namespace) -> int:
    warm = WarmArgs.from_namespace(args)
    warmer = Warmer(warm)
    server = http.server.ThreadingHTTPServer((warm.host, warm.port), _handler(warmer.state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="warm-ready", daemon=True).start()
    log.info("warming %s%s; /ready on %s:%d", warmer.base, warm.request_path, warm.host, warm.port)
    try:
        warmer.run()
    finally:
        server.shutdown()
    return 0
