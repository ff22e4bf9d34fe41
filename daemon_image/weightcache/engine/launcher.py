"""``weightcache engine --tp-size N``: one process per local rank, supervised as a unit.

Ranks of one engine are useless apart. The launcher starts them (rank 0 serves HTTP), forwards
SIGTERM to rank 0 only — rank 0 drains, then tells the other ranks to stop — and watches every
child: if any rank exits non-zero, the rest are killed at once and the launcher exits non-zero,
so a supervisor (kubelet, systemd, a test) sees the failure instead of a half-dead engine. The
children get PR_SET_PDEATHSIG, so a launcher killed outright does not leave ranks behind.

An engine spanning nodes (``--nnodes N --node-rank k``) has one launcher per node, each starting
only its node's ranks ``[k·rpn, (k+1)·rpn)`` (``local_ranks``); all of them meet at the rendezvous
that node 0's rank 0 hosts (``--dist-addr``). A launcher without rank 0 cannot drain anything:
on SIGTERM it waits up to ``FOLLOWER_GRACE_S`` for its ranks to be told to stop by rank 0 (the
whole engine is going), then kills them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import EngineArgs

log = logging.getLogger("weightcache.engine.launcher")

PR_SET_PDEATHSIG = 1
POLL_S = 0.05
FOLLOWER_GRACE_S = 15.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def rank_gpus(tp_size: int, visible: str | None) -> list[str]:
    """The GPU each rank sees as its only device: the r-th of CUDA_VISIBLE_DEVICES, or GPU r."""
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else [str(r) for r in range(tp_size)]
    if len(devices) < tp_size:
        raise WeightCacheError(f"--tp-size {tp_size} needs {tp_size} GPUs; CUDA_VISIBLE_DEVICES lists {visible!r}")
    return devices[:tp_size]


def local_ranks(tp_size: int, nnodes: int = 1, node_rank: int = 0) -> list[int]:
    """The global ranks node ``node_rank`` of ``nnodes`` runs: ``[k·rpn, (k+1)·rpn)``, the same
    mapping the operator uses to decide which daemon holds which ranks."""
    if nnodes < 1 or tp_size % nnodes:
        raise WeightCacheError(f"--tp-size {tp_size} must be a multiple of --nnodes {nnodes}")
    if not 0 <= node_rank < nnodes:
        raise WeightCacheError(f"--node-rank {node_rank} must be in [0, --nnodes {nnodes})")
    per_node = tp_size // nnodes
    return list(range(node_rank * per_node, (node_rank + 1) * per_node))


def launch(engine: EngineArgs, gpus: bool = False, ranks: list[int] | None = None) -> int:
    """Run ``weightcache engine`` with ``engine``'s flags as rank r for every local rank (``ranks``,
    default all of ``engine.tp_size``); returns the engine's exit code.

    With ``gpus``, each rank runs with CUDA_VISIBLE_DEVICES set to its own GPU only (the i-th
    local rank gets the i-th visible GPU), so every rank computes on its device 0 and nccl sees
    one distinct GPU per rank.
    """
    ranks = list(range(engine.tp_size)) if ranks is None else ranks
    devices = rank_gpus(len(ranks), os.environ.get("CUDA_VISIBLE_DEVICES")) if gpus else []
    children: dict[int, subprocess.Popen[bytes]] = {}
    for i, rank in enumerate(ranks):
        argv = [sys.executable, "-m", "weightcache", "engine", *engine.but(tp_rank=rank).to_argv()]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": devices[i]} if gpus else None
        children[rank] = subprocess.Popen(argv, preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL, env=env)
    log.info(
        "ranks started",
        extra={"fields": {"ranks": ",".join(map(str, ranks)), "pids": ",".join(str(c.pid) for c in children.values())}},
    )

    leads = 0 in children
    terminating_at: float | None = None

    def on_term(signum: int, _frame: object) -> None:
        nonlocal terminating_at
        terminating_at = terminating_at or time.monotonic()
        if leads and children[0].poll() is None:
            children[0].send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    leader_exit_at: float | None = None
    while True:
        terminating = terminating_at is not None
        for rank, child in children.items():
            code = child.poll()
            leader_done = not leads or children[0].returncode == 0
            if code is not None and code != 0 and rank != 0 and terminating and leader_done:
                continue  # rank 0 drained and left first; a follower that noticed before its stop is fine
            if code is not None and code != 0:
                log.error(
                    "rank exited; stopping the engine",
                    extra={"fields": {"rank": rank, "code": code, "terminating": terminating}},
                )
                _kill_all(children)
                return code if code > 0 else 128 - code
        if all(c.poll() is not None for c in children.values()):
            return 0
        if not leads and terminating_at is not None and time.monotonic() - terminating_at > FOLLOWER_GRACE_S:
            log.warning("rank 0 never told this node's ranks to stop; killing them")
            _kill_all(children)
            return 0
        if leads and children[0].poll() is not None:  # rank 0 finished cleanly: followers must follow shortly
            leader_exit_at = leader_exit_at or time.monotonic()
            if time.monotonic() - leader_exit_at > FOLLOWER_GRACE_S:
                log.error("ranks still running after rank 0 exited; killing them")
                _kill_all(children)
                return 1
        time.sleep(POLL_S)


def _kill_all(children: dict[int, subprocess.Popen[bytes]]) -> None:
    for child in children.values():
        if child.poll() is None:
            child.kill()
    for child in children.values():
        child.wait()
