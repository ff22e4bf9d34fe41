"""DaemonReport objects as a daemon's status endpoint sends them: ranks with the facts a loaded
rank reports, and the node's report over them."""

from __future__ import annotations

from typing import Any

from weightcache_contract.daemon_report import DaemonReport, RankReport, node_fingerprint


def rank(n: int, ready: bool = True, **extra: Any) -> RankReport:
    """Rank ``n`` loaded from disk, with facts distinct per rank (``extra`` overrides them), or
    still loading when not ``ready``."""
    facts = dict(
        pid=100 + n,
        backend="cpu-shm",
        bytes=4096 * (n + 1),
        tensor_count=39,
        load_seconds=0.5 + n,
        source="disk",
        fingerprint=f"{n}" * 64,
        disk_bytes_read=4000 * (n + 1),
    )
    return (
        RankReport(rank=n, ready=ready, **{**facts, **extra})
        if ready
        else RankReport(rank=n, ready=False, problem="loading")
    )


def report(*ranks: RankReport) -> DaemonReport:
    """Cache tiny's report over ``ranks``: ready when every rank is, with their node fingerprint."""
    return DaemonReport(
        cache="tiny", ready=all(r.ready for r in ranks), fingerprint=node_fingerprint(list(ranks)), ranks=list(ranks)
    )
