"""Readiness of a node's ranks, as a Kubernetes readiness probe or a script would check it.

A rank is ready when its ready file parses, a live process holds its lock (the kernel's word,
immune to pid reuse and pid namespaces), and its socket answers with the same pid and
fingerprint the ready file names.
"""

from __future__ import annotations

from .client import DaemonConnection
from .errors import WeightCacheError
from .rankfiles import RankFiles


def probe(socket_dir: str, name: str, ranks: list[int], timeout_s: float = 2.0) -> list[str]:
    """Problems found, one line each; an empty list means every rank is ready."""
    problems = []
    for rank in ranks:
        files = RankFiles(socket_dir, name, rank)
        ready = files.read_ready()
        if ready is None:
            problems.append(f"rank {rank}: no ready file at {files.ready}")
            continue
        if not files.lock_is_held():
            problems.append(f"rank {rank}: ready file names pid {ready.pid}, but no live daemon holds {files.lock}")
            continue
        try:
            with DaemonConnection(files.socket, timeout_s, client="probe") as conn:
                status = conn.status()
        except WeightCacheError as exc:
            problems.append(f"rank {rank}: socket does not answer: {exc}")
            continue
        if status.pid != ready.pid or status.fingerprint_digest != ready.fingerprint_digest:
            problems.append(f"rank {rank}: socket is served by pid {status.pid}, ready file names pid {ready.pid}")
    return problems
