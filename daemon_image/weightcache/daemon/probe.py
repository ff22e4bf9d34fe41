"""Readiness of a node's ranks, as a Kubernetes readiness probe, the status endpoint or a script
would check it.

A rank is ready when its ready file parses, a live process holds its lock (the kernel's word,
immune to pid reuse and pid namespaces), and its socket answers with the same pid and
fingerprint the ready file names. With a GPU holder's grant file (pods of a GPU backend), also
when the running holder still books the rank's GPU: a rank whose GPU is out of the scheduler's
books may share it with any pod the scheduler sends there.
"""

from __future__ import annotations

from pathlib import Path

from weightcache_contract.errors import WeightCacheError

from ..client.weights import DaemonConnection
from ..gpu.gpu_grant import grant_problem
from ..wire.protocol import StatusReply
from ..wire.rankfiles import RankFiles


def inspect_rank(
    socket_dir: str, name: str, rank: int, timeout_s: float = 2.0, gpus_file: str | None = None
) -> tuple[StatusReply | None, str | None]:
    """(the rank's status reply if it answered, the problem if it is not ready); a ready rank
    gives ``(reply, None)``. ``gpus_file``: the GPU holder's grant the rank's GPU must be in."""
    files = RankFiles(socket_dir, name, rank)
    ready = files.read_ready()
    if ready is None:
        return None, f"rank {rank}: no ready file at {files.ready}"
    if not files.lock_is_held():
        return None, f"rank {rank}: ready file names pid {ready.pid}, but no live daemon holds {files.lock}"
    try:
        with DaemonConnection(files.socket, timeout_s, client="probe") as conn:
            status = conn.status()
    except WeightCacheError as exc:
        return None, f"rank {rank}: socket does not answer: {exc}"
    if status.pid == ready.pid and status.fingerprint_digest != ready.fingerprint_digest:
        # The rank adopted new shard stamps between the two reads (watch.py): the socket serves the
        # new fingerprint first, and the ready file follows it at once.
        ready = files.read_ready() or ready
    if status.pid != ready.pid or status.fingerprint_digest != ready.fingerprint_digest:
        return status, f"rank {rank}: socket is served by pid {status.pid}, ready file names pid {ready.pid}"
    if gpus_file and status.device_uuid:
        problem = grant_problem(Path(gpus_file), status.device_uuid)
        if problem is not None:
            return status, f"rank {rank}: {problem}"
    return status, None


def probe(
    socket_dir: str, name: str, ranks: list[int], timeout_s: float = 2.0, gpus_file: str | None = None
) -> list[str]:
    """Problems found, one line each; an empty list means every rank is ready."""
    problems = []
    for rank in ranks:
        _status, problem = inspect_rank(socket_dir, name, rank, timeout_s, gpus_file)
        if problem is not None:
            problems.append(problem)
    return problems
