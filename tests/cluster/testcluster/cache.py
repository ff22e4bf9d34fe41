"""Where built and unpacked tools live: outside the repository, shared by every clone."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$WEIGHTCACHE_CACHE`` or ``~/.cache/weightcache``: survives fresh clones, never committed."""
    configured = os.environ.get("WEIGHTCACHE_CACHE")
    return Path(configured) if configured else Path.home() / ".cache" / "weightcache"
