"""Hand-over between operator replicas: at most one replica writes at any moment.

kopf peering decides which replica should act (the highest priority one alive), but its pause is
no barrier. A replica resumes on its first read of the peering object, while the replica it
displaces only learns of it from its own watch a moment later; handlers already running in
threads finish their passes after the pause, and events already queued to a worker still run
(kopf's daemons.py says so, #1266). So the replica that should act also takes a lease before it
writes, and the one that should not releases it only once it runs nothing:

- the lease is an annotation on the replicas' own ClusterKopfPeering object (no other object, no
  other permission): the holder's identity, when it last renewed, for how long that holds;
- it is taken only while free (absent, released, or not renewed within its duration), with the
  object's resourceVersion as a precondition, so of two replicas taking it at once one wins;
- the holder renews it every third of its duration and, when it cannot, stops entering passes
  once its own view of the lease (measured from before the renewal request) runs out;
- it is released only when this replica wants it no more (acts for no cache, see
  ``Reconciler.acting``) and no pass or finalization is inside (``enter``/``leave``).

Expiry compares the holder's written renewal time with this replica's clock, as kopf's peering
does with its peers' ``lastseen``: the replicas' clocks must agree to well within the duration.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from weightcache_operator.kubeapi import ApiError, KubeApi

ANNOTATION = "weightcache.io/acting-replica"
POLL_SECONDS = 0.5
"""How often a replica that wants the lease looks whether it is free."""

log = logging.getLogger("weightcache_operator.run.handover")


class HandOver:
    """The lease of one replica; ``enter`` before a pass, ``leave`` after it. Thread-safe."""

    def __init__(
        self,
        api: KubeApi,
        peering: str,
        identity: str,
        duration: float,
        on_taken: Callable[[], None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.api = api
        self.path = f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}"
        self.identity = identity
        self.duration = duration
        self._on_taken = on_taken
        self._clock = clock
        self._lock = threading.Condition()
        self._wanted = False
        self._wanted_until = 0.0
        """A brief want (monotonic deadline) from a refused finalization: kopf retries it."""
        self._inside = 0
        self._valid_until: float | None = None
        """Monotonic end of the lease as this replica holds it; None while not held."""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="handover", daemon=True)
        self._thread.start()

    # --- callers ---------------------------------------------------------------------------------

    def want(self, on: bool) -> None:
        """Whether this replica acts for any cache (and so needs the lease)."""
        with self._lock:
            self._wanted = on
            self._lock.notify_all()

    def enter(self, briefly: bool = False) -> bool:
        """True: the lease is held, and stays held until the matching ``leave``. False: not held
        now (nothing may be written); ``briefly`` asks for it for a few seconds anyway (a
        finalization, which kopf retries, of a cache no replica acts for any more)."""
        with self._lock:
            if self._held():
                self._inside += 1
                return True
            if briefly:
                self._wanted_until = time.monotonic() + self.duration
                self._lock.notify_all()
            return False

    def leave(self) -> None:
        with self._lock:
            self._inside -= 1
            self._lock.notify_all()

    def held(self) -> bool:
        with self._lock:
            return self._held()

    def stop(self) -> None:
        """At the operator's exit: release the lease if nothing is inside, so the next replica
        need not wait out its duration."""
        self._stopped.set()
        with self._lock:
            self._wanted, self._wanted_until = False, 0.0
            self._lock.notify_all()
        self._thread.join(timeout=5)
        with self._lock:
            if self._valid_until is not None and self._inside == 0:
                self._release()

    # --- the keeper thread -----------------------------------------------------------------------

    def _held(self) -> bool:
        return self._valid_until is not None and time.monotonic() < self._valid_until

    def _wants(self) -> bool:
        return self._wanted or time.monotonic() < self._wanted_until

    def _keep(self) -> None:
        while not self._stopped.is_set():
            wants = False
            try:
                with self._lock:
                    if self._valid_until is not None and not self._wants() and self._inside == 0:
                        self._release()  # under the lock: no pass enters meanwhile
                    wants, held = self._wants(), self._valid_until is not None
                if held:
                    self._renew()
                elif wants and self._take():
                    log.info("hand-over lease taken: this replica writes now", extra={"identity": self.identity})
                    self._on_taken()
            except Exception as error:  # noqa: BLE001 - an API server away for a while must not end the keeper
                log.warning("hand-over lease: no answer from the API", extra={"error": repr(error)})
            with self._lock:
                if self._valid_until is not None:
                    # Held: renew on time, or release as soon as nothing wants it.
                    self._lock.wait_for(
                        lambda: self._stopped.is_set() or (not self._wants() and self._inside == 0),
                        timeout=self.duration / 3,
                    )
                else:
                    # Not held: look again soon while wanted, at once when a want appears.
                    self._lock.wait_for(self._want_turned(wants), timeout=POLL_SECONDS if wants else None)

    def _want_turned(self, before: bool) -> Callable[[], bool]:
        return lambda: self._stopped.is_set() or self._wants() != before

    def _record(self) -> tuple[dict[str, Any] | None, str]:
        body = self.api.get(self.path)
        text = (body["metadata"].get("annotations") or {}).get(ANNOTATION)
        try:
            record = json.loads(text) if text else None
        except ValueError:
            record = None  # not ours to read: treated as free, and overwritten
        return record, body["metadata"]["resourceVersion"]

    def _write(self, value: str | None, version: str) -> bool:
        patch = {"metadata": {"resourceVersion": version, "annotations": {ANNOTATION: value}}}
        try:
            self.api.patch(self.path, patch)
        except ApiError as error:
            if error.status == 409:  # written meanwhile (kopf's keep-alives too): look again
                return False
            raise
        return True

    def _free(self, record: dict[str, Any] | None) -> bool:
        if not record or record.get("holder") == self.identity:
            return True
        try:
            renewed = datetime.fromisoformat(record["renewed"])
            duration = float(record["duration"])
        except (KeyError, TypeError, ValueError):
            return True
        return renewed + timedelta(seconds=duration) <= self._clock()

    def _stamp(self) -> str:
        return json.dumps({"holder": self.identity, "renewed": self._clock().isoformat(), "duration": self.duration})

    def _take(self) -> bool:
        started = time.monotonic()
        record, version = self._record()
        if not self._free(record):
            return False
        if not self._write(self._stamp(), version):
            return False
        with self._lock:
            self._valid_until = started + self.duration
        return True

    def _renew(self) -> None:
        for _ in range(5):
            started = time.monotonic()
            record, version = self._record()
            if not record or record.get("holder") != self.identity:
                with self._lock:
                    self._valid_until = None
                log.warning("hand-over lease lost to another replica", extra={"record": record})
                return
            if self._write(self._stamp(), version):
                with self._lock:
                    self._valid_until = started + self.duration
                return

    def _release(self) -> None:
        """Caller holds ``_lock``: no pass enters while the lease goes."""
        self._valid_until = None
        try:
            for _ in range(5):
                record, version = self._record()
                if not record or record.get("holder") != self.identity or self._write(None, version):
                    break
        except Exception as error:  # noqa: BLE001 - it expires on its own
            log.warning("hand-over lease: release failed", extra={"error": repr(error)})
        log.info("hand-over lease released", extra={"identity": self.identity})
