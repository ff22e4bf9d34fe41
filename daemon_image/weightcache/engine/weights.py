"""The engine's three weight modes, like SGLang's ``--weight-cache-mode``.

- ``off``: read this rank's shard from disk with the daemon's own loader (same plan, same bytes).
- ``client``: map the rank's arena from a running daemon; on a missing daemon or a fingerprint
  mismatch, ``--weight-cache-fallback`` decides between the disk and an error.
- ``daemon``: for single-machine use — make sure daemons for the engine's ranks run (spawning
  ``weightcache daemon --ranks …`` detached if they do not, so they outlive this engine and the
  next start maps instead of loading), then behave exactly like ``client``.

Whatever the mode, each rank reports what it used, why it fell back, bytes mapped vs loaded, and
seconds spent; the report is what ``/metrics`` and the startup log show.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import DaemonArgs

from ..checkpoints.sharding import Layout
from ..client.weights import Weights, expect, load_from_disk, load_weights
from ..daemon.probe import probe
from ..wire.rankfiles import RankFiles

log = logging.getLogger("weightcache.engine.weights")

Mode = Literal["off", "client", "daemon"]
MODES: tuple[str, ...] = ("off", "client", "daemon")


@dataclass(frozen=True)
class WeightSource:
    """Where one engine's weights come from; the same for every rank of it."""

    model: str
    mode: Mode = "off"
    fallback: Literal["disk", "error"] = "disk"
    socket_dir: str | None = None
    name: str | None = None
    dtype: str = "auto"
    quantization: str = "none"
    weight_block_size: tuple[int, int] | None = None
    revision: str = ""
    backend: str = "cpu-shm"
    daemon_timeout_s: float = 600.0

    @property
    def device(self) -> str:
        """Where this engine's weights, and so its computation, live."""
        return "cuda" if self.backend in GPU_BACKENDS else "cpu"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise WeightCacheError(f"--weight-cache-mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if self.mode != "off" and (not self.socket_dir or not self.name):
            raise WeightCacheError(f"--weight-cache-mode {self.mode} needs --socket-dir and --name")


def load_rank(source: WeightSource, layout: Layout) -> tuple[Weights, dict[str, Any]]:
    """This rank's weights and its report (``mode_requested`` + the client's own report)."""
    if source.mode == "off":
        expected = expect(
            source.model,
            layout,
            dtype=source.dtype,
            quantization=source.quantization,
            weight_block_size=source.weight_block_size,
            revision=source.revision,
            backend=source.backend,
        )
        weights = load_from_disk(expected)
    else:
        weights = load_weights(
            source.model,
            layout,
            socket_dir=source.socket_dir,
            name=source.name,
            fallback=source.fallback,
            dtype=source.dtype,
            quantization=source.quantization,
            weight_block_size=source.weight_block_size,
            revision=source.revision,
            backend=source.backend,
        )
    report = {"rank": layout.rank, "mode_requested": source.mode, **weights.report()}
    return weights, report


def ensure_daemons(
    source: WeightSource, ranks: list[int], tp_size: int, ep_size: int = 1, log_dir: str | None = None
) -> dict[str, Any]:
    """``daemon`` mode: start daemons for ``ranks`` unless all already answer; wait until they do.

    The daemons run in their own session so that they outlive the engine: that is the point —
    the first start pays for the disk, every later start maps. Returns what was done.
    """
    assert source.socket_dir and source.name
    started = time.perf_counter()
    problems = probe(source.socket_dir, source.name, ranks)
    if not problems:
        return {"spawned": False, "seconds": time.perf_counter() - started}
    # A live daemon on some rank would refuse a second one on the same rank: only spawn the missing.
    missing = [r for r in ranks if not RankFiles(source.socket_dir, source.name, r).lock_is_held()]
    daemon = DaemonArgs(
        model=source.model,
        name=source.name,
        socket_dir=source.socket_dir,
        backend=source.backend,
        tp_size=tp_size,
        ep_size=ep_size,
        dtype=source.dtype,
        quantization=source.quantization,
        weight_block_size=source.weight_block_size,
        revision=source.revision,
        ranks=tuple(missing),
    )
    argv = [sys.executable, "-m", "weightcache", "daemon", *daemon.to_argv()]
    pid = None
    if missing:
        log_path = Path(log_dir or source.socket_dir) / f"{source.name}-daemon.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ},
            )
        pid = proc.pid
        log.info(
            "spawned daemons",
            extra={"fields": {"ranks": ",".join(map(str, missing)), "pid": pid, "log": str(log_path)}},
        )
    deadline = time.monotonic() + source.daemon_timeout_s
    while problems := probe(source.socket_dir, source.name, ranks):
        if pid is not None and proc.poll() is not None:
            raise WeightCacheError(f"the spawned daemon exited {proc.returncode} before it was ready: {problems[0]}")
        if time.monotonic() > deadline:
            raise WeightCacheError(f"daemons not ready after {source.daemon_timeout_s:.0f} s: {problems[0]}")
        time.sleep(0.05)
    return {"spawned": bool(missing), "daemon_pid": pid, "seconds": time.perf_counter() - started}
