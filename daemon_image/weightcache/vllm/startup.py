"""A vLLM engine's startup timeline, in the reference engine's phases (engine/timeline.py).

Each mark is the seconds since the kernel started ``vllm serve``'s first process (the API server)
at which a phase ended, logged through vLLM's logger as ``startup rank=… phase=… seconds=…`` and
exported on vLLM's own ``/metrics`` as ``weightcache_engine_startup_seconds{rank,phase}``, as the
reference engine exports it. Where each phase's end comes from:

- ``imports``: the plug-in's first call in the API server (vLLM loads plug-ins once it is imported
  and parses its arguments).
- ``distributed_init``: the loader is asked for the model (``load_model``); by then the engine
  core and its workers have started, imported vLLM and joined their process groups.
- ``weights_bound``: ``load_model`` returns: every weight mapped from the cache and bound (or, on
  a fallback, loaded from disk).
- ``compile``: vLLM's own ``torch.compile took … in total`` and ``Graph capturing finished …``
  lines, whichever came last; absent when vLLM neither compiles nor captures (``--enforce-eager``).
- ``warmup``: vLLM's ``init engine (profile, create kv cache, warmup model) took …``: the memory
  profile, the KV cache and the warm-up run.
- ``ready``: uvicorn's ``Application startup complete.`` in the API server: ``/health`` answers.

vLLM runs its API server, engine core and workers as processes of their own (the engine core and
the workers import torch and vLLM again), and the plug-in is loaded in each: the first sets
``WEIGHTCACHE_ENGINE_STARTED_AT`` (its start, from /proc) and ``WEIGHTCACHE_ENGINE_STARTUP_DIR``
(a directory where every process leaves its marks), which the processes it starts inherit; the
API server's ``/metrics`` reads the directory. vLLM's lines are recognised by their format string
(``record.msg``), never by their formatted text.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..engine.timeline import PHASES, process_start_time

log = logging.getLogger("vllm.weightcache")
STARTED_ENV = "WEIGHTCACHE_ENGINE_STARTED_AT"
DIR_ENV = "WEIGHTCACHE_ENGINE_STARTUP_DIR"
METRIC = "weightcache_engine_startup_seconds"

VLLM_LINES = {
    "torch.compile took": "compile",
    "torch.compile takes": "compile",
    "Graph capturing finished": "compile",
    "init engine (profile, create kv cache, warmup model) took": "warmup",
}
"""Part of a vLLM log format string → the phase it ends (vLLM 0.26 to 0.32; a format string may
begin with a ``%s`` prefix, so these are looked for anywhere in it)."""
UVICORN_READY = "Application startup complete."

_lock = threading.Lock()
_installed = False
_disabled = False
_rank = 0
_marks: dict[str, float] = {}
_unsaid: list[tuple[int, str, float]] = []


def phase_of(record: logging.LogRecord) -> str | None:
    """The phase a vLLM or uvicorn log record says has ended, if any."""
    msg = record.msg
    if not isinstance(msg, str):
        return None
    if msg == UVICORN_READY:
        return "ready"
    return next((phase for part, phase in VLLM_LINES.items() if part in msg), None)


class _VllmLines(logging.Handler):
    """Marks the phases vLLM's own log lines end (a handler on the ``vllm`` logger: its modules'
    records propagate to it)."""

    def emit(self, record: logging.LogRecord) -> None:
        phase = phase_of(record)
        if phase is not None:
            mark(phase)


class _UvicornReady(logging.Filter):
    """Marks ``ready`` on uvicorn's startup line. A filter, not a handler: uvicorn configures its
    loggers with ``dictConfig`` when the server starts, which removes their handlers but keeps
    their filters. It lets every record through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if phase_of(record) == "ready":
            mark("ready")
        return True


def install() -> None:
    """On every call of the plug-in: the watcher of vLLM's lines, put back if vLLM's logging
    configuration (``dictConfig``, which replaces the ``vllm`` logger's handlers) removed it. Once
    per process: time zero, the marks' directory, uvicorn's watcher, the ``/metrics`` collector;
    ``imports`` in the first process."""
    global _installed
    if _disabled:
        return
    watched = logging.getLogger("vllm")
    if not any(isinstance(h, _VllmLines) for h in watched.handlers):
        watched.addHandler(_VllmLines())
    with _lock:
        if _installed:
            return
        _installed = True
    first = STARTED_ENV not in os.environ
    if first:
        os.environ[STARTED_ENV] = repr(process_start_time())
        os.environ[DIR_ENV] = where = tempfile.mkdtemp(prefix="weightcache-startup-")
        atexit.register(shutil.rmtree, where, ignore_errors=True)
    logging.getLogger("uvicorn.error").addFilter(_UvicornReady())
    _export()
    if first:
        mark("imports")


def disable() -> None:
    """No timeline in this process: a vLLM-profile daemon runs vLLM's loader (and vLLM loads the
    plug-in) to publish weights, not to serve."""
    global _disabled
    _disabled = True


def set_rank(rank: int) -> None:
    """This process's rank in the cache's numbering (a worker, once its loader knows it)."""
    global _rank
    _rank = rank


def mark(phase: str) -> float:
    """Records that ``phase`` ended now: logged, and left for ``/metrics``."""
    started = float(os.environ.get(STARTED_ENV) or process_start_time())
    seconds = max(time.time() - started, 0.0)
    with _lock:
        _marks[phase] = seconds
        marks, rank = dict(_marks), _rank
        _unsaid.append((rank, phase, seconds))
        # The API server loads plug-ins before vLLM configures its logging (until then its logger
        # drops INFO): ``imports`` waits for the next mark to be logged.
        said = list(_unsaid) if log.isEnabledFor(logging.INFO) else []
        del _unsaid[: len(said)]
    for line in said:
        log.info("startup rank=%d phase=%s seconds=%.3f", *line)
    where = os.environ.get(DIR_ENV)
    if where:
        _leave(Path(where), {"rank": rank, "marks": marks})
    return seconds


def _leave(where: Path, record: dict[str, Any]) -> None:
    """This process's marks as ``<pid>.json``, replaced whole (a reader never sees half a file)."""
    target = where / f"{os.getpid()}.json"
    partial = target.with_suffix(".partial")
    try:
        partial.write_text(json.dumps(record))
        os.replace(partial, target)
    except OSError as error:  # a start is never stopped for its report
        log.warning("startup marks not written to %s: %s", where, error)


def collected(where: Path) -> dict[tuple[int, str], float]:
    """(rank, phase) → seconds over every process's marks; the latest end of a phase when several
    processes of one rank mark it (the API server and the engine core both count as rank 0)."""
    found: dict[tuple[int, str], float] = {}
    for path in sorted(where.glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for phase, seconds in record.get("marks", {}).items():
            key = (int(record.get("rank", 0)), str(phase))
            found[key] = max(found.get(key, 0.0), float(seconds))
    return found


def _export() -> None:
    """``weightcache_engine_startup_seconds`` on vLLM's ``/metrics`` (prometheus_client's default
    registry, which vLLM serves with one API server; with ``--api-server-count`` above 1 vLLM
    serves a multi-process registry instead and the phases are in the log only)."""
    try:
        from prometheus_client import REGISTRY
        from prometheus_client.core import GaugeMetricFamily
    except ImportError:
        return

    class Collector:
        def collect(self) -> Iterator[GaugeMetricFamily]:
            family = GaugeMetricFamily(
                METRIC, "seconds since process start at which each startup phase ended", labels=["rank", "phase"]
            )
            where = os.environ.get(DIR_ENV)
            marks = collected(Path(where)) if where else {}
            order = {phase: i for i, phase in enumerate(PHASES)}
            for (rank, phase), seconds in sorted(marks.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
                family.add_metric([str(rank), phase], seconds)
            yield family

    REGISTRY.register(Collector())
