"""What a rank is doing before it can answer on its socket, as one line for its launcher.

A rank opens its socket only once its weights are loaded, so until then the launcher's status
endpoint could only say "no ready file" — for a rank loading for minutes and for one waiting
forever alike. A rank started by the launcher writes here what it is doing or waiting for (the
GPU holder's grant and why there is none, how far its load got; the launcher writes "starting"
first); the endpoint reports that as the rank's problem, and the operator shows it in the
DaemonsReady condition.

The path comes from ``$WEIGHTCACHE_STATUS_NOTE`` (the launcher sets one per rank in a directory of
its own); unset, notes go nowhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from weightcache_contract.termination import clip

ENV = "WEIGHTCACHE_STATUS_NOTE"


def note(text: str) -> None:
    """Replaces this process's note (atomically: the launcher never reads half a line)."""
    target = os.environ.get(ENV)
    if not target:
        return
    path = Path(target)
    try:
        partial = path.with_name(f".{path.name}.partial")
        partial.write_bytes(clip(text, 1024))
        os.replace(partial, path)
    except OSError:
        pass  # a note is a courtesy; it must never stop a rank
