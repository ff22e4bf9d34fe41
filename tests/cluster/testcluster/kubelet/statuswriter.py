"""Patches pod status as soon as anything changes, coalescing bursts into one request."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..rest import ApiError, Kube

if TYPE_CHECKING:
    from .pods import PodWorker

log = logging.getLogger(__name__)


class StatusWriter:
    """One thread drains a set of dirty pods; a pod marked dirty twice before its patch is
    patched once, with its latest status. Strategic merge keeps other owners' conditions."""

    def __init__(self, kube: Kube, may_report: Callable[[PodWorker], bool]) -> None:
        self.kube = kube
        self.may_report = may_report
        self._dirty: dict[int, PodWorker] = {}
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-status-writer")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        if self._thread.ident is not None:  # a kubelet whose start failed early never started it
            self._thread.join(timeout=5)

    def submit(self, worker: PodWorker) -> None:
        with self._wake:
            self._dirty[id(worker)] = worker
            self._wake.notify()

    def flush(self, worker: PodWorker) -> None:
        """Writes one pod's status synchronously (used right before deleting it)."""
        self._write(worker)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._stopped:
                    self._wake.wait()
                if self._stopped:
                    return
                batch = list(self._dirty.values())
                self._dirty.clear()
            for worker in batch:
                self._write(worker)

    def _write(self, worker: PodWorker) -> None:
        if not self.may_report(worker):
            return
        try:
            self.kube.patch(
                f"/api/v1/namespaces/{worker.namespace}/pods/{worker.name}/status",
                {"metadata": {"uid": worker.uid}, "status": worker.status_patch()},
            )
        except ApiError as error:
            if error.status not in (404, 409):
                log.warning("status of %s/%s: %s", worker.namespace, worker.name, error)
        except Exception:  # noqa: BLE001 - the next change writes again
            log.exception("status of %s/%s", worker.namespace, worker.name)
