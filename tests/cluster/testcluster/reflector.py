"""List-then-watch, as client-go's reflector does: what the process kubelet, the hollow fleet
and the Service proxy follow the API server with."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from .rest import ApiError, Kube, Object

log = logging.getLogger(__name__)


def follow(
    kube: Kube,
    path: str,
    *,
    relist: Callable[[], str],
    on_event: Callable[[str, Object], None],
    stopped: threading.Event,
    what: str,
    resource_version: str | None = None,
    retry_s: float = 0.2,
    watch_seconds: int = 60,
    **params: Any,
) -> None:
    """Hands every event of ``path`` but bookmarks to ``on_event`` until ``stopped`` is set.

    ``relist`` lists afresh, brings the caller's state in line with the listing (objects deleted
    while no watch was open send no DELETED) and returns the listing's resourceVersion; it runs
    first when no ``resource_version`` is given, and after every failed watch (410 Gone, a lost
    connection). ``params`` (a labelSelector, say) go with every watch, each of which the server
    ends after ``watch_seconds`` (a silent stream is given up 10 s after that)."""
    while not stopped.is_set():
        try:
            if resource_version is None:
                resource_version = relist()
            for kind, obj in kube.watch(
                path, resource_version=resource_version, timeout_seconds=watch_seconds, **params
            ):
                if stopped.is_set():
                    return
                if kind == "ERROR":
                    raise ApiError(int(obj.get("code", 500)), obj)
                resource_version = obj["metadata"]["resourceVersion"]
                if kind != "BOOKMARK":
                    on_event(kind, obj)
        except Exception as error:  # noqa: BLE001 - re-list and carry on
            if stopped.is_set():
                return
            log.info("%s restarts after %r", what, error)
            resource_version = None
            stopped.wait(retry_s)
