"""The daemon pod's HTTP status endpoint: ``GET /status`` (JSON) and ``GET /metrics`` (Prometheus).

It runs in the launcher (``weightcache daemon --ranks … --status-addr HOST:PORT``), the one
process that knows every local rank and outlives their loads and crashes. It asks each rank over
its Unix socket, exactly as the readiness probe does, so the endpoint, the probe and the rank's
own counters can never disagree about what "ready" means. This is how the operator learns bytes,
GPU UUIDs and fingerprints without the daemon holding any Kubernetes API rights.

Read-only by construction (readonly_http.py): GET only, two fixed paths, and nothing in a request
reaches a rank but the fixed ``status`` message.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .daemon_report import DaemonReport, RankReport, node_fingerprint, report_metrics
from .device_memory import memory_report
from .probe import inspect_rank
from .readonly_http import PROMETHEUS_TEXT, ReadOnlyServer

RANK_TIMEOUT_S = 1.0
"""Per-rank socket timeout: a stopped or wedged rank costs a scrape this long, not a hang."""

ExitCode = Callable[[int], int | None]
"""rank → its process's exit code, None while it runs (the launcher's record, no syscalls)."""


def collect(socket_dir: str, name: str, ranks: list[int], exit_code: ExitCode,
            timeout_s: float = RANK_TIMEOUT_S, gpus_file: str | None = None) -> DaemonReport:
    """Ask every local rank at once, so a report takes one rank timeout at worst. ``gpus_file``:
    the GPU holder's grant, checked as the readiness probe checks it."""

    def one(rank: int) -> RankReport:
        code = exit_code(rank)
        if code is not None:
            return RankReport(rank=rank, ready=False, problem=f"rank {rank}: process exited with code {code}")
        status, problem = inspect_rank(socket_dir, name, rank, timeout_s, gpus_file)
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
    gpus = [r.gpu_uuid for r in reports if r.gpu_uuid]
    return DaemonReport(cache=name, ready=bool(reports) and all(r.ready for r in reports),
                        fingerprint=node_fingerprint(reports), ranks=reports,
                        memory=memory_report(gpus))  # fmt: skip


def status_endpoint(addr: tuple[str, int], report: Callable[[], DaemonReport]) -> ReadOnlyServer:
    """The endpoint, bound but not yet serving; every request takes a fresh report."""
    return ReadOnlyServer(addr, {
        "/status": lambda: ("application/json", report().model_dump_json(indent=1).encode()),
        "/metrics": lambda: (PROMETHEUS_TEXT, report_metrics(report()).render().encode()),
    }, what="status endpoint")  # fmt: skip
