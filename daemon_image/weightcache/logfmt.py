"""Structured log lines (logfmt) so that daemon and engine logs can be grepped and parsed.

Call sites pass key/value context through ``extra={"fields": {...}}``; the formatter renders
``ts=… level=… logger=… msg="…" key=value`` on one line.
"""

from __future__ import annotations

import logging
import sys
import time

LEVEL_ENV = "WEIGHTCACHE_LOG_LEVEL"
"""``--log-level``'s default: how a launcher hands its level to the processes it starts."""


def _quote(value: object) -> str:
    text = str(value)
    if text and all(c.isalnum() or c in "-_./:@+" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        parts = [
            f"ts={ts}",
            f"level={record.levelname.lower()}",
            f"logger={record.name}",
            f"msg={_quote(record.getMessage())}",
        ]
        for key, value in (getattr(record, "fields", None) or {}).items():
            parts.append(f"{key}={_quote(value)}")
        if record.exc_info:
            parts.append(f"exc={_quote(self.formatException(record.exc_info))}")
        return " ".join(parts)


def setup(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
