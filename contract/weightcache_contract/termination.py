"""The container's termination message: why a weightcache process gave up, in the file Kubernetes
reads when the container exits (``terminationMessagePath``), so ``kubectl describe pod`` and the
operator's conditions show the daemon's own error instead of "crash-looping".

The path comes from ``$WEIGHTCACHE_TERMINATION_LOG``, which the operator sets to the container's
``terminationMessagePath``; unset, nothing is written. There is no default of
``/dev/termination-log``: outside a container that path is the host's, and a daemon run by hand
must not write into it. The launcher (``daemon --ranks``) points each rank at a file of its own
and relays the first failed rank's message as its own.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV = "WEIGHTCACHE_TERMINATION_LOG"
LIMIT_BYTES = 4096
"""Kubernetes keeps at most this much of a termination message."""


def clip(message: str, limit: int = LIMIT_BYTES) -> bytes:
    """``message`` as UTF-8 cut to ``limit`` bytes, never in the middle of a character."""
    return message.encode()[:limit].decode(errors="ignore").encode()


def write(message: str, path: str | None = None) -> None:
    """Writes ``message`` as the termination message (to ``path``, else ``$WEIGHTCACHE_TERMINATION_LOG``);
    a no-op without either. Never raises: failing to explain must not hide the exit code."""
    target = path or os.environ.get(ENV)
    if not target:
        return
    try:
        Path(target).write_bytes(clip(message))
    except OSError:
        pass


def read(path: str | os.PathLike[str]) -> str | None:
    """The message a process left at ``path``; None when it left none."""
    try:
        text = Path(path).read_bytes()[:LIMIT_BYTES].decode(errors="replace").strip()
    except OSError:
        return None
    return text or None
