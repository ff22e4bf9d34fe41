"""The status a pass aggregates, as the reasons and refusals scenarios build its daemons and read
it back: CACHE (BASE as parsed), daemon pods of its generation, and a written condition by type."""

from __future__ import annotations

from functools import partial
from typing import Any

from builders import daemon, make
from weightcache_operator.render import daemon_spec_hash

CACHE = make()
cache_daemon = partial(daemon, spec_hash=daemon_spec_hash(CACHE), ready=False)
"""A daemon pod of CACHE's generation, not Ready unless said."""


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    """The condition of type ``kind`` in a status as ``aggregate(...).wire()`` writes it."""
    return next(c for c in status["conditions"] if c["type"] == kind)
