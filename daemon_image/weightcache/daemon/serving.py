"""What a daemon answers once a connection said hello: config, fetch, status, ping.

The fetch reply (manifest included) is encoded once: with tens of thousands of tensors it is the
largest message on the wire, and it never changes during the daemon's life.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

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


class DaemonService:
    def __init__(self, served: Served, stats: ServerStats) -> None:
        self.served = served
        self.stats = stats
        arena = served.arena
        self._fetch_frame = encode(
            FetchReply(
                backend=arena.backend,
                manifest=served.manifest,
                mapping_bytes=arena.mapping_bytes,
                device_uuid=arena.device_uuid,
            )
        )

    def __call__(self, request: object, _fds: list[int]) -> Reply:
        s = self.served
        if isinstance(request, Ping):
            return Reply(Pong())
        if isinstance(request, QueryConfig):
            return Reply(
                ConfigReply(
                    fingerprint=s.fingerprint,
                    fingerprint_digest=s.fingerprint.digest,
                    backend=s.arena.backend,
                    arena_bytes=s.arena.size,
                    tensor_count=len(s.manifest),
                    device_uuid=s.arena.device_uuid,
                )
            )
        if isinstance(request, Fetch):
            return self._fetch(request)
        if isinstance(request, Status):
            with self.stats.lock:
                return Reply(
                    StatusReply(
                        pid=os.getpid(),
                        name=s.name,
                        rank=s.rank,
                        backend=s.arena.backend,
                        fingerprint_digest=s.fingerprint.digest,
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
                        weights_digest=s.fingerprint.weights_digest,
                    )
                )
        raise Reject("bad_message", f"{getattr(request, 'type', request)!r} is not a daemon request")

    def _fetch(self, request: Fetch) -> Reply:
        ours = self.served.fingerprint.digest
        if request.fingerprint_digest != ours:
            raise Reject(
                "fingerprint_mismatch",
                f"daemon holds fingerprint {ours[:16]}…, engine expects {request.fingerprint_digest[:16]}…; "
                "query_config shows what the daemon holds",
            )
        export = self.served.arena.export()
        with self.stats.lock:
            self.served.fetches_total += 1
        if export.ipc is not None:
            arena = self.served.arena
            return Reply(
                FetchReply(
                    backend=arena.backend,
                    manifest=self.served.manifest,
                    mapping_bytes=arena.mapping_bytes,
                    device_uuid=arena.device_uuid,
                    ipc=export.ipc,
                )
            )
        return Reply(self._fetch_frame, [export.fd] if export.fd is not None else [])
