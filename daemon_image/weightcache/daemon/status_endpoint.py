"""The daemon pod's HTTP status endpoint: ``GET /status`` (JSON), ``GET /metrics`` (Prometheus) and
``GET /ready`` (the pod's readiness probe: 200 when every local rank is ready, else 503 and why).

It runs in the launcher (``weightcache daemon --ranks … --status-addr HOST:PORT``), the one
process that knows every local rank and outlives their loads and crashes. It asks each rank over
its Unix socket, exactly as the readiness probe does, so the endpoint, the probe and the rank's
own counters can never disagree about what "ready" means. This is how the operator learns bytes,
GPU UUIDs and fingerprints without the daemon holding any Kubernetes API rights.

Read-only by construction (readonly_http.py): GET only, three fixed paths, and nothing in a
request reaches a rank but the fixed ``status`` message.

``GET /status`` carries an ``ETag``: ``report_digest`` of the report (daemon_report.py), which
changes when what the report says about the ranks does (readiness, problems, fingerprints, the
checkpoint watch's verdict) and not with counters. ``GET /status?wait=S&after=ETAG`` is a long
poll: it answers at once when the report's digest differs from ``after``, else when it changes or
after ``S`` seconds (at most ``MAX_WAIT_S``), whichever comes first. This is how the operator
hears of a checkpoint change within about a second instead of at its next re-read (its
daemon_status.py). The ranks push nothing, so while anyone waits, one thread (``ReportChanges``)
asks them every ``CHANGE_POLL_S`` over their sockets, as ``/ready`` does, and wakes the waiters
when the digest moves; with nobody waiting it stops. Waiters are capped (``MAX_WAITERS``): a peer
that opens more long polls gets 503 at once, so it cannot pin the endpoint's threads, and plain
``/status``, ``/metrics`` and ``/ready`` are never queued behind the waiters.

Why the readiness probe is an HTTP GET here rather than an exec of ``weightcache probe``: an exec
starts a Python process every period, which a busy node delays past any sane timeout (measured:
a loaded 2-core node failed the exec probe for longer than the engines' 30 s gate grace). The
launcher already runs; the check it serves is the same ``inspect_rank`` the probe runs.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus

from weightcache_contract.daemon_report import (
    ArtifactReport,
    DaemonReport,
    RankReport,
    node_fingerprint,
    report_digest,
    report_metrics,
)
from weightcache_contract.readonly_http import PROMETHEUS_TEXT, BadRequest, ReadOnlyServer, Reply

from ..gpu.device_memory import memory_report
from ..wire.rankfiles import RankFiles
from .probe import inspect_rank

RANK_TIMEOUT_S = 1.0
"""Per-rank socket timeout: a stopped or wedged rank costs a scrape this long, not a hang."""

MAX_WAIT_S = 60.0
"""The longest ``?wait=`` a long poll may ask for; more is refused (400), naming this."""
MAX_WAITERS = 8
"""Long polls waiting at once; more are answered 503 at once. The operator holds one per pod
(two while replicas hand over), so this leaves room for people and a second operator."""
CHANGE_POLL_S = 0.25
"""How often the ranks are asked while someone waits: the long poll's delay after a change is
at most this plus one rank round trip."""
_DIGEST = re.compile(r"[0-9a-f]{1,64}")

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
            source="keeper" if status.adopted else "peer" if status.seed and status.seed.peer else "disk",
            seed=status.seed,
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


class ReportChanges:
    """The long poll's waiting room: at most ``max_waiters`` at once, one poller thread for all
    of them, running only while someone waits."""

    def __init__(
        self, report: Callable[..., DaemonReport], poll_s: float = CHANGE_POLL_S, max_waiters: int = MAX_WAITERS
    ) -> None:
        self._report = report
        self.poll_s = poll_s
        self.max_waiters = max_waiters
        self._changed = threading.Condition()
        self._digest: str | None = None  # the poller's latest look
        self._waiters = 0
        self._polling = False

    def wait(self, after: str, wait_s: float) -> tuple[DaemonReport, str] | None:
        """The report and its digest once the digest differs from ``after`` or ``wait_s`` has
        passed; None, at once, when ``max_waiters`` wait already. A request that need not wait
        (no ``wait``, or news already) is answered at once and never counts as a waiter."""
        now = self._report()
        digest = report_digest(now)
        if digest != after or wait_s <= 0:
            return now, digest
        with self._changed:
            if self._waiters >= self.max_waiters:
                return None
            self._waiters += 1
            try:
                deadline = time.monotonic() + wait_s
                self._digest = digest
                if not self._polling:
                    self._polling = True
                    threading.Thread(target=self._poll, name="status-changes", daemon=True).start()
                while self._digest == after and (left := deadline - time.monotonic()) > 0:
                    self._changed.wait(left)
            finally:
                self._waiters -= 1
        now = self._report()
        return now, report_digest(now)

    def _poll(self) -> None:
        while True:
            with self._changed:
                if not self._waiters:
                    self._polling = False
                    return
            try:
                digest: str | None = report_digest(self._report(memory=False))
            except Exception:  # noqa: BLE001 - a failed look is no change; the waiters time out
                digest = None
            with self._changed:
                if digest is not None and digest != self._digest:
                    self._digest = digest
                    self._changed.notify_all()
            time.sleep(self.poll_s)


def long_poll(changes: ReportChanges, parameters: Mapping[str, str]) -> Reply:
    """``GET /status[?wait=S&after=ETAG]``: the report with its ``ETag`` (see the module's doc)."""
    unknown = sorted(parameters.keys() - {"wait", "after"})
    if unknown:
        raise BadRequest(f"unknown query parameter(s) {', '.join(map(repr, unknown))}; it takes wait and after")
    after = parameters.get("after", "").strip('"')
    if after and not _DIGEST.fullmatch(after):
        raise BadRequest(f"after={after[:80]!r} is not an ETag of this endpoint (hex digits)")
    text = parameters.get("wait", "0")
    try:
        wait_s = float(text)
    except ValueError:
        raise BadRequest(f"wait={text[:40]!r} is not a number of seconds") from None
    if not math.isfinite(wait_s) or not 0 <= wait_s <= MAX_WAIT_S:
        raise BadRequest(f"wait={text[:40]!r} is not between 0 and {MAX_WAIT_S:g} seconds")
    answered = changes.wait(after, wait_s)
    if answered is None:
        body = json.dumps({"error": f"{changes.max_waiters} long polls wait already; try again later"}).encode()
        return Reply("application/json", body, HTTPStatus.SERVICE_UNAVAILABLE, {"Retry-After": "1"})
    report, digest = answered
    return Reply("application/json", report.model_dump_json(indent=1).encode(), headers={"ETag": f'"{digest}"'})


def status_endpoint(
    addr: tuple[str, int], report: Callable[..., DaemonReport], changes: ReportChanges | None = None
) -> ReadOnlyServer:
    """The endpoint, bound but not yet serving; every request takes a fresh report
    (``report(memory=False)`` for ``/ready``)."""
    changes = changes or ReportChanges(report)
    return ReadOnlyServer(
        addr,
        {
            "/metrics": lambda: (PROMETHEUS_TEXT, report_metrics(report()).render().encode()),
            "/ready": lambda: readiness(report(memory=False)),
        },
        what="status endpoint",
        queried={"/status": lambda parameters: long_poll(changes, parameters)},
    )
