"""The startup timeline: process start → imports → distributed init → weights bound → warm-up → ready.

Time zero is when the kernel started the process (from /proc), not when Python reached our
code: interpreter start-up and imports are part of what a restart costs, and on a GPU host
``import torch`` alone is seconds. Each mark is logged as it happens and kept for ``/metrics``.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger("weightcache.engine.timeline")

PHASES = ("imports", "distributed_init", "weights_bound", "compile", "warmup", "ready")
"""Every engine's phases, in order (vLLM's too: vllm/startup.py); the reference engine compiles
nothing, so it never marks ``compile``."""


def process_start_time() -> float:
    """Wall-clock time at which this process started, per the kernel; now if /proc is unavailable.

    The age comes from /proc/uptime (10 ms resolution) minus the start time in clock ticks since
    boot; /proc/stat's btime would do too, but it is rounded to whole seconds.
    """
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])  # field 22 of stat(5); counted after the ")" that ends the name
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return time.time()


class Timeline:
    def __init__(self, rank: int = 0, started_at: float | None = None) -> None:
        self.rank = rank
        self.started_at = process_start_time() if started_at is None else started_at
        self.marks: dict[str, float] = {}  # phase → seconds since process start

    def mark(self, phase: str) -> float:
        elapsed = max(time.time() - self.started_at, 0.0)
        self.marks[phase] = elapsed
        log.info("startup", extra={"fields": {"rank": self.rank, "phase": phase, "seconds": f"{elapsed:.3f}"}})
        return elapsed

    def durations(self) -> dict[str, float]:
        """Seconds spent in each phase (from the previous mark), in timeline order."""
        out, previous = {}, 0.0
        for phase in PHASES:
            if phase in self.marks:
                out[phase] = self.marks[phase] - previous
                previous = self.marks[phase]
        return out
