"""Polling waits whose failures say what was last seen, not just that time ran out."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A condition did not hold in time; the message carries the last observation."""


def wait_for(
    condition: Callable[[], T],
    timeout: float = 30.0,
    *,
    interval: float = 0.1,
    describe: str | Callable[[], object] | None = None,
) -> T:
    """Calls ``condition`` until it returns something truthy and returns that value.

    Exceptions raised by ``condition`` count as "not yet" (the API object may not exist yet);
    on timeout the last value or exception, and ``describe`` (a text, or a callable evaluated
    then, e.g. a dump of the pods), go into the error so a failure is debuggable from the log.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = condition()
            if last:
                return last  # type: ignore[return-value]
        except Exception as error:  # noqa: BLE001 - remembered and reported on timeout
            last = error
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    name = getattr(condition, "__name__", repr(condition))
    message = f"{name} did not hold within {timeout:.1f}s; last seen: {last!r}"
    if describe is not None:
        try:
            detail = describe() if callable(describe) else describe
        except Exception as error:  # noqa: BLE001
            detail = f"<describe failed: {error!r}>"
        message += f"\n{detail}"
    raise WaitTimeout(message)
