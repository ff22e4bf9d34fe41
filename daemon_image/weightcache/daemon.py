"""One daemon process per rank: validate, fingerprint, load once, serve until told to stop.

The order matters. Everything that can be wrong with the input (quantization method,
checkpoint files, parallel layout) is checked before the rank's lock is taken, so a bad
checkpoint never leaves files behind. The ready file appears only after the socket listens,
and disappears first on shutdown, so a reader of the ready file can always connect.
"""

from __future__ import annotations

import grp
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .arena import create_arena
from .checkpoint import open_checkpoint
from .fingerprint import compute
from .loader import fill, plan_rank, resolve_dtype
from .manifest import Manifest
from .progress import Progress
from .quantization import resolve
from .rankfiles import RankFiles, ReadyInfo
from .server import DaemonServer, PeerPolicy, Served
from .sharding import Layout

log = logging.getLogger("weightcache.daemon")


@dataclass
class DaemonConfig:
    model: str
    layout: Layout
    socket_dir: str
    name: str
    dtype: str = "auto"
    quantization: str = "none"
    weight_block_size: tuple[int, int] | None = None
    backend: str = "cpu-shm"
    revision: str = ""
    socket_group: str | None = None
    allow_uids: list[int] = field(default_factory=list)
    allow_gids: list[int] = field(default_factory=list)


def run(cfg: DaemonConfig) -> int:
    """Load and serve one rank; returns the exit code. Input errors raise ``WeightCacheError``."""
    quant = resolve(cfg.quantization, None, cfg.weight_block_size)  # cheap allowlist check before any I/O
    checkpoint = open_checkpoint(cfg.model)
    quant = resolve(cfg.quantization, checkpoint.quantization_config, cfg.weight_block_size)
    dtype = resolve_dtype(cfg.dtype, checkpoint)
    fingerprint = compute(checkpoint, cfg.layout, quant, dtype, revision=cfg.revision, backend=cfg.backend)
    plan = plan_rank(checkpoint, cfg.layout, quant, dtype)
    rank = cfg.layout.rank
    files = RankFiles(cfg.socket_dir, cfg.name, rank)
    gid = grp.getgrnam(cfg.socket_group).gr_gid if cfg.socket_group else None
    fields = {"cache": cfg.name, "rank": rank, "fingerprint": fingerprint.digest[:16], "backend": cfg.backend}

    files.claim(dir_mode=0o750 if gid is not None else 0o700)
    if gid is not None:
        os.chown(files.dir, -1, gid)
    stop_requested = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True
        raise KeyboardInterrupt  # interrupts loading; serving installs its own handler below

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    arena = None
    try:
        log.info("loading", extra={"fields": {**fields, "tensors": len(plan.entries), "arena_bytes": plan.arena_bytes,
                                               "read_bytes": plan.read_bytes}})
        arena = create_arena(cfg.backend, plan.arena_bytes, f"{cfg.name}/rank-{rank}")
        progress = Progress(plan.read_bytes, f"{cfg.name}/rank-{rank}")
        entries = fill(checkpoint, plan, arena.buffer(), quant.weight_block_size, progress)
        load_seconds = progress.finish()
        checkpoint.close()
        arena.seal()
        manifest = Manifest.build(fingerprint.digest, arena.size, entries, plan.aliases)
        served = Served(name=cfg.name, rank=rank, arena=arena, manifest=manifest, fingerprint=fingerprint,
                        load_seconds=load_seconds, disk_bytes_read=checkpoint.bytes_read)
        policy = PeerPolicy(uids=frozenset({os.getuid(), 0, *cfg.allow_uids}),
                            gids=frozenset({*cfg.allow_gids, *([gid] if gid is not None else [])}))
        server = DaemonServer(str(files.socket), served, policy,
                              socket_mode=0o660 if gid is not None else 0o600, socket_gid=gid)
        signal.signal(signal.SIGTERM, lambda *_: server.stop())
        signal.signal(signal.SIGINT, lambda *_: server.stop())
        files.write_ready(ReadyInfo(
            pid=os.getpid(), name=cfg.name, rank=rank, backend=cfg.backend, socket=str(files.socket),
            fingerprint_digest=fingerprint.digest, fingerprint=fingerprint, arena_bytes=arena.size,
            tensor_count=len(entries), load_seconds=load_seconds, started_at=time.time()))
        log.info("ready", extra={"fields": {**fields, "socket": str(files.socket), "load_seconds": f"{load_seconds:.3f}"}})
        server.serve_forever()
        log.info("stopped", extra={"fields": fields})
        return 0
    except KeyboardInterrupt:
        if stop_requested:
            log.info("stopped during load", extra={"fields": fields})
            return 0
        raise
    finally:
        files.release()
        if arena is not None:
            arena.close()


def launch_local_ranks(ranks: list[int], tp_size: int, pp_size: int, child_args: list[str]) -> int:
    """Start one daemon process per local rank and supervise them as a unit.

    Ranks of one engine are useless apart, so if any child exits, the rest are stopped and the
    launcher exits with the first failure's code; SIGTERM is forwarded to every child.
    """
    children: dict[int, subprocess.Popen[bytes]] = {}
    for rank in ranks:
        layout = Layout.from_rank(rank, tp_size, pp_size)
        argv = [sys.executable, "-m", "weightcache", "daemon", *child_args,
                "--tp-size", str(tp_size), "--tp-rank", str(layout.tp_rank),
                "--pp-size", str(pp_size), "--pp-rank", str(layout.pp_rank)]
        children[rank] = subprocess.Popen(argv)

    def forward(signum: int, _frame: object) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    exit_code = 0
    while children:
        pid, status = os.wait()
        rank = next((r for r, c in children.items() if c.pid == pid), None)
        if rank is None:
            continue
        child = children.pop(rank)
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode != 0 and exit_code == 0:
            exit_code = child.returncode if child.returncode > 0 else 128 - child.returncode
            log.error("rank exited; stopping the others", extra={"fields": {"rank": rank, "code": child.returncode}})
            forward(signal.SIGTERM, None)
    return exit_code


def default_socket_dir() -> str:
    return os.environ.get("WEIGHTCACHE_SOCKET_DIR") or str(Path(os.environ.get("XDG_RUNTIME_DIR", "/tmp")) / "weightcache")
