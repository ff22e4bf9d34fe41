"""What a daemon answers once a connection said hello: config, fetch, status, ping.

The fetch reply (manifest included) is encoded once per identity: with tens of thousands of
tensors it is the largest message on the wire, and it changes only when the daemon adopts new
stamps for the same bytes (watch.py).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from weightcache_contract.daemon_report import CheckpointWatch
from weightcache_contract.seeding import SeedReport

from ..arenas.arena import Arena
from ..checkpoints.manifest import Manifest
from ..wire.fingerprint import Fingerprint
from ..wire.protocol import ConfigReply, Fetch, FetchReply, Ping, Pong, QueryConfig, Status, StatusReply, encode
from .server import Reject, Reply, ServerStats


@dataclass
class Served:
    name: str
    rank: int
    arena: Arena
    manifest: Manifest
    fingerprint: Fingerprint
    load_seconds: float
    disk_bytes_read: int
    adopted: bool = False
    deposited: bool = False
    started: float = field(default_factory=time.monotonic)
    fetches_total: int = 0
    checkpoint: CheckpointWatch | None = None
    """What the checkpoint watch (watch.py) last saw; None when the rank does not watch."""
    seed: SeedReport | None = None
    """How the rank asked peers for its bytes (seeding/client.py); None when it did not."""
    chunk_digests: list[str] | None = None
    """The arena's chunk digests when a seed brought them (verified): serving seeds on needs no re-hash."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def identity(self) -> tuple[Fingerprint, Manifest]:
        """The fingerprint and manifest served now, taken together (``adopt`` replaces both)."""
        with self._lock:
            return self.fingerprint, self.manifest

    def adopt(self, fingerprint: Fingerprint) -> None:
        """Serve the same arena under ``fingerprint``: only the shards' stamps may differ from the
        fingerprint served now, and only once their content was verified equal (watch.py)."""
        with self._lock:
            self.fingerprint = fingerprint
            self.manifest = self.manifest.model_copy(update={"fingerprint_digest": fingerprint.digest})


class DaemonService:
    def __init__(self, served: Served, stats: ServerStats) -> None:
        self.served = served
        self.stats = stats
        self._frames: tuple[Manifest, bytes] | None = None

    def _fetch_frame(self, manifest: Manifest) -> bytes:
        """The encoded fetch reply for ``manifest``, encoded once per identity the daemon serves."""
        cached = self._frames
        if cached is None or cached[0] is not manifest:
            arena = self.served.arena
            frame = encode(
                FetchReply(
                    backend=arena.backend,
                    manifest=manifest,
                    mapping_bytes=arena.mapping_bytes,
                    device_uuid=arena.device_uuid,
                )
            )
            cached = self._frames = (manifest, frame)
        return cached[1]

    def __call__(self, request: object, _fds: list[int]) -> Reply:
        s = self.served
        if isinstance(request, Ping):
            return Reply(Pong())
        if isinstance(request, QueryConfig):
            fingerprint, _ = s.identity()
            return Reply(
                ConfigReply(
                    fingerprint=fingerprint,
                    fingerprint_digest=fingerprint.digest,
                    backend=s.arena.backend,
                    arena_bytes=s.arena.size,
                    tensor_count=len(s.manifest),
                    device_uuid=s.arena.device_uuid,
                )
            )
        if isinstance(request, Fetch):
            return self._fetch(request)
        if isinstance(request, Status):
            fingerprint, _ = s.identity()
            with self.stats.lock:
                return Reply(
                    StatusReply(
                        pid=os.getpid(),
                        name=s.name,
                        rank=s.rank,
                        backend=s.arena.backend,
                        fingerprint_digest=fingerprint.digest,
                        arena_bytes=s.arena.mapping_bytes,
                        tensor_count=len(s.manifest),
                        load_seconds=s.load_seconds,
                        disk_bytes_read=s.disk_bytes_read,
                        uptime_seconds=time.monotonic() - s.started,
                        connections_total=self.stats.connections_total,
                        connections_active=self.stats.connections_active,
                        fetches_total=s.fetches_total,
                        errors_total=self.stats.errors_total,
                        device_uuid=s.arena.device_uuid,
                        adopted=s.adopted,
                        deposited=s.deposited,
                        weights_digest=fingerprint.weights_digest,
                        checkpoint=s.checkpoint,
                        seed=s.seed,
                    )
                )
        raise Reject("bad_message", f"{getattr(request, 'type', request)!r} is not a daemon request")

    def _fetch(self, request: Fetch) -> Reply:
        fingerprint, manifest = self.served.identity()
        ours = fingerprint.digest
        if request.fingerprint_digest != ours:
            watch = self.served.checkpoint
            verifying = (
                f"; it is verifying rewritten checkpoint files ({', '.join(watch.changed_files)}) and serves "
                "them under their new stamps once their bytes prove equal: status shows its progress"
                if watch is not None and watch.state == "verifying"
                else ""
            )
            raise Reject(
                "fingerprint_mismatch",
                f"daemon holds fingerprint {ours[:16]}…, engine expects {request.fingerprint_digest[:16]}…; "
                f"query_config shows what the daemon holds{verifying}",
            )
        export = self.served.arena.export()
        with self.stats.lock:
            self.served.fetches_total += 1
        if export.ipc is not None:
            arena = self.served.arena
            return Reply(
                FetchReply(
                    backend=arena.backend,
                    manifest=manifest,
                    mapping_bytes=arena.mapping_bytes,
                    device_uuid=arena.device_uuid,
                    ipc=export.ipc,
                )
            )
        return Reply(self._fetch_frame(manifest), [export.fd] if export.fd is not None else [])
