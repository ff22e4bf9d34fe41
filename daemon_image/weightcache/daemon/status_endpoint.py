"""The daemon pod's HTTP status endpoint: ``GET /status`` (JSON), ``GET /metrics`` (Prometheus) and
``GET /ready`` (the pod's readiness probe: 200 when every local rank is ready, else 503 and why).

It runs in the launcher (``weightcache daemon --ranks … --status-addr HOST:PORT``), the one
process that knows every local rank and outlives their loads and crashes. It asks each rank over
its Unix socket, exactly as the readiness probe does, so the endpoint, the probe and the rank's
own counters can never disagree about what "ready" means. This is how the operator learns bytes,
GPU UUIDs and fingerprints without the daemon holding any Kubernetes API rights.

Read-only by construction (readonly_http.py): GET only, three fixed paths, and nothing in a
request reaches a rank but the fixed ``status`` message.

Why the readiness probe is an HTTP GET here rather than an exec of ``weightcache probe``: an exec
starts a Python process every period, which a busy node delays past any sane timeout (measured:
a loaded 2-core node failed the exec probe for longer than the engines' 30 s gate grace). The
launcher already runs; the check it serves is the same ``inspect_rank`` the probe runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

from weightcache_contract.daemon_report import (
    ArtifactReport,
    DaemonReport,
    RankReport,
    node_fingerprint,
    report_metrics,
)
from weightcache_contract.readonly_http import PROMETHEUS_TEXT, ReadOnlyServer

from ..gpu.device_memory import memory_report
from ..wire.rankfiles import RankFiles
from .probe import inspect_rank

RANK_TIMEOUT_S = 1.0
"""Per-rank socket timeout: a stopped or wedged rank costs a scrape this long, not a hang."""

RankText = Callable[[int], str | None]
"""rank → a line about it, or None (the launcher's records: no syscalls, no waiting)."""


def collect(
    socket_dir: str,
    name: str,
    ranks: list[int],
    ended: RankText,
    timeout_s: float = RANK_TIMEOUT_S,
    gpus_file: str | None = None,
    memory: bool = True,
    note: RankText = lambda _rank: None,
    artifacts: Callable[[], ArtifactReport] | None = None,
) -> DaemonReport:
    """Ask every local rank at once, so a report takes one rank timeout at worst. ``ended``: why
    the rank's process ended (exit code and message), None while it runs; ``note``: what a rank
    that has no socket yet says it is doing (status_note.py); ``gpus_file``: the GPU holder's
    grant, checked as the readiness probe checks it; ``memory``: also read free memory (the
    readiness verdict does not need it); ``artifacts``: the compile-artifact publisher's counts."""

    def one(rank: int) -> RankReport:
        why = ended(rank)
        if why is not None:
            return RankReport(rank=rank, ready=False, problem=f"rank {rank}: {why}")
        status, problem = inspect_rank(socket_dir, name, rank, timeout_s, gpus_file)
        if status is None:
            doing = note(rank) if not RankFiles(socket_dir, name, rank).ready.exists() else None
            return RankReport(rank=rank, ready=False, problem=f"rank {rank}: {doing}" if doing else problem)
        return RankReport(
            rank=rank,
            ready=problem is None,
            problem=problem,
            pid=status.pid,
            backend=status.backend,
            bytes=status.arena_bytes,
            tensor_count=status.tensor_count,
            gpu_uuid=status.device_uuid,
            load_seconds=status.load_seconds,
            source="keeper" if status.adopted else "disk",
            fingerprint=status.weights_digest or status.fingerprint_digest,
            disk_bytes_read=status.disk_bytes_read,
            maps_served=status.fetches_total,
            connections_total=status.connections_total,
            deposited=status.deposited,
            uptime_seconds=status.uptime_seconds,
            checkpoint=status.checkpoint,
        )

    with ThreadPoolExecutor(max_workers=max(1, len(ranks)), thread_name_prefix="status") as pool:
        reports = list(pool.map(one, ranks))
    gpus = [r.gpu_uuid for r in reports if r.gpu_uuid]
    return DaemonReport(
        cache=name,
        ready=bool(reports) and all(r.ready for r in reports),
        fingerprint=node_fingerprint(reports),
        ranks=reports,
        memory=memory_report(gpus) if memory else [],
        artifacts=artifacts() if artifacts is not None and memory else None,
    )


def readiness(report: DaemonReport) -> tuple[str, bytes, HTTPStatus]:
    """``GET /ready``: 200 when every local rank is ready, else 503 naming each rank's problem."""
    problems = [r.problem or f"rank {r.rank}: not ready" for r in report.ranks if not r.ready]
    if not report.ranks:
        problems = ["no local ranks"]
    body = json.dumps({"ready": not problems, "problems": problems}).encode()
    return "application/json", body, HTTPStatus.SERVICE_UNAVAILABLE if problems else HTTPStatus.OK


def status_endpoint(addr: tuple[str, int], report: Callable[..., DaemonReport]) -> ReadOnlyServer:
    """The endpoint, bound but not yet serving; every request takes a fresh report
    (``report(memory=False)`` for ``/ready``)."""
    return ReadOnlyServer(
        addr,
        {
            "/status": lambda: ("application/json", report().model_dump_json(indent=1).encode()),
            "/metrics": lambda: (PROMETHEUS_TEXT, report_metrics(report()).render().encode()),
            "/ready": lambda: readiness(report(memory=False)),
        },
        what="status endpoint",
    )
