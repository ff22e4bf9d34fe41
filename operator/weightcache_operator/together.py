"""A pass's independent API requests, sent at once: the pass waits for the slowest one instead
of their sum, which is most of a pass on a busy API server (docs/benchmarks.md, scale). Its
reads (snapshot.observe) and, in the executor (executor.py), its readiness-gate patches, the
daemons' DaemonSets, the Service with its budget and consecutive engine creations go this way.

The pool is shared by every cache's passes (reconcile.py), so a burst of passes queues on it
instead of opening a connection each."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, wait
from typing import Any

THREADS = 16
"""Threads of the shared pool: up to six requests per pass at once, so a few passes send theirs
together."""


def all_at_once(pool: Executor | None, **calls: Callable[[], Any]) -> dict[str, Any]:
    """Every call's answer by name, the calls run on ``pool`` together (one after another on the
    caller's thread without it); the first call that raised raises here, once all have ended, so
    no request is left running behind a pass that gave up."""
    if pool is None:
        return {key: call() for key, call in calls.items()}
    futures = {key: pool.submit(call) for key, call in calls.items()}
    wait(futures.values())
    return {key: future.result() for key, future in futures.items()}
