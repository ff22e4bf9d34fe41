"""Load progress: a live line on a terminal, periodic structured log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

from .. import status_note

log = logging.getLogger("weightcache.load")


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


class Progress:
    def __init__(self, total_bytes: int, label: str, stream: TextIO | None = None, log_every_s: float = 5.0) -> None:
        self.total = max(total_bytes, 1)
        self.done = 0
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.log_every_s = log_every_s
        self.started = time.monotonic()
        self._last_emit = 0.0
        status_note.note(f"loading the weights: {_gib(total_bytes)} to read")

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        now = time.monotonic()
        if now - self._last_emit >= (0.2 if self.tty else self.log_every_s):
            self._last_emit = now
            self._emit(now)

    def finish(self) -> float:
        seconds = time.monotonic() - self.started
        if self.tty:
            self.stream.write("\n")
        log.info(
            "loaded",
            extra={
                "fields": {
                    "cache": self.label,
                    "bytes": self.done,
                    "seconds": f"{seconds:.3f}",
                    "rate_mib_s": f"{self.done / 2**20 / max(seconds, 1e-9):.1f}",
                }
            },
        )
        return seconds

    def _emit(self, now: float) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        status_note.note(f"loading the weights: {_gib(self.done)} of {_gib(self.total)} read, ETA {eta:.0f} s")
        if self.tty:
            pct = 100.0 * self.done / self.total
            self.stream.write(
                f"\r{self.label}: {pct:5.1f}%  {_gib(self.done)} / {_gib(self.total)}  "
                f"{rate / 2**20:8.1f} MiB/s  ETA {eta:6.1f} s"
            )
            self.stream.flush()
        else:
            log.info(
                "loading",
                extra={
                    "fields": {
                        "cache": self.label,
                        "bytes": self.done,
                        "total": self.total,
                        "rate_mib_s": f"{rate / 2**20:.1f}",
                        "eta_s": f"{eta:.1f}",
                    }
                },
            )
