"""A Ready rank serving its arena to starting peers of the same cache.

The peer is not hurt by it: every connection's bytes pass one token bucket per rank (the
``--seed-max-mib-s`` cap), only ``--seed-max-clients`` seeds run at once (others are told to try
later, and try other peers meanwhile), and the bytes go from the arena to the socket with no copy
on a host arena. Nothing is served before the client proved it holds the cache's credential and
asked for exactly the weights this rank holds.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from weightcache_contract.errors import ProtocolError, WeightCacheError

from ..wire.protocol import Deadlines, PeerClosed, decode, encode, recv_frame, send_frame
from .arena_bytes import ArenaBytes, chunk_spans
from .messages import (
    CHUNK_BYTES,
    HELLO,
    MAX_HELLO_BYTES,
    RANGE,
    SEED_PROTOCOL,
    SeedBusy,
    SeedChallenge,
    SeedHello,
    SeedOffer,
    SeedProof,
    SeedRefused,
    client_proof,
    nonce,
    proofs_equal,
    read_credential,
    server_proof,
)

if TYPE_CHECKING:
    from ..arenas.arena import Arena
    from ..checkpoints.manifest import Manifest
    from ..wire.fingerprint import Fingerprint

log = logging.getLogger("weightcache.seeding")

HELLO_S = 10.0
"""How long a connection may take to prove itself."""
RANGE_IDLE_S = 60.0
"""How long a chunks connection may wait between ranges."""
SEND_BLOCK = 1 * 2**20
MAX_CONNECTIONS = 64
"""Connections served at once, whatever their state: a flood of half-open ones cannot pin threads."""


class Served(Protocol):
    """What a seed server needs of the rank it serves (``daemon.serving.Served`` is one)."""

    rank: int
    arena: Arena
    chunk_digests: list[str] | None

    def identity(self) -> tuple[Fingerprint, Manifest]: ...


class TokenBucket:
    """``rate`` bytes per second shared by every sender of a rank; 0: no cap."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        with self._lock:
            now = time.monotonic()
            start = max(self._next, now)
            self._next = start + n / self.rate
        if start > now:
            time.sleep(start - now)


class SeedServer:
    def __init__(
        self,
        served: Served,
        address: tuple[str, int],
        credential_file: str,
        *,
        max_clients: int = 2,
        max_bytes_per_s: float = 0.0,
        fields: dict[str, Any] | None = None,
    ) -> None:
        self.served = served
        self.credential_file = credential_file
        self.max_clients = max(1, max_clients)
        self.bucket = TokenBucket(max_bytes_per_s)
        self.fields = fields or {}
        self._sessions: dict[str, float] = {}
        """Open seed sessions → when a byte of theirs last moved (monotonic)."""
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._digests: list[str] | None = None
        self._digest_lock = threading.Lock()
        self._stopped = threading.Event()
        self.seeds_served = 0
        self.bytes_sent = 0
        self.refused = 0
        try:
            self._listener = socket.create_server(address, backlog=64)
        except OSError as exc:
            raise WeightCacheError(
                f"cannot serve seeds on {address[0]}:{address[1]}: {exc.strerror}; choose another --seed-listen"
            ) from None
        self.address = self._listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, daemon=True, name="seed-server")

    def start(self) -> SeedServer:
        self._thread.start()
        log.info("serving seeds", extra={"fields": {**self.fields, "address": f"{self.address[0]}:{self.address[1]}"}})
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._listener.close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def chunk_digests(self) -> list[str]:
        """The arena's chunk digests: handed over by a seed, else hashed once, on the first offer."""
        with self._digest_lock:
            if self._digests is None:
                given = self.served.chunk_digests
                if given is not None:
                    self._digests = given
                else:
                    began = time.monotonic()
                    self._digests = ArenaBytes(self.served.arena, self.served.arena.size).digests(CHUNK_BYTES)
                    log.info(
                        "seed digests ready",
                        extra={
                            "fields": {
                                **self.fields,
                                "chunks": len(self._digests),
                                "seconds": f"{time.monotonic() - began:.2f}",
                            }
                        },
                    )
            return self._digests

    # -- connections -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, peer = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if len(self._connections) >= MAX_CONNECTIONS:
                    connection.close()
                    continue
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection, peer), daemon=True, name="seed-conn").start()

    def _serve(self, connection: socket.socket, peer: tuple[str, int]) -> None:
        where = f"{peer[0]}:{peer[1]}"
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            challenge = SeedChallenge(version=SEED_PROTOCOL, nonce=nonce())
            send_frame(connection, challenge)
            hello_by = time.monotonic() + HELLO_S
            body = recv_frame(
                connection, MAX_HELLO_BYTES, deadlines=Deadlines(HELLO_S, HELLO_S, hello_by=hello_by, hello_s=HELLO_S)
            )
            hello: SeedHello = decode(HELLO, body)
            key = self._admit(connection, hello, challenge.nonce, where)
            if key is None:
                return
            if hello.want == "offer":
                self._offer(connection, hello, challenge.nonce, key, where)
            else:
                send_frame(connection, SeedProof(proof=server_proof(key, hello, challenge.nonce, b"")))
                self._send_ranges(connection, hello)
        except (ProtocolError, OSError) as exc:
            if not self._stopped.is_set() and not isinstance(exc, PeerClosed):
                log.info("seed connection ended", extra={"fields": {**self.fields, "peer": where, "why": str(exc)}})
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _refuse(self, connection: socket.socket, reason: str, detail: str, where: str) -> None:
        self.refused += 1
        log.warning(
            "seed refused", extra={"fields": {**self.fields, "peer": where, "reason": reason, "detail": detail}}
        )
        send_frame(connection, SeedRefused(reason=reason, detail=detail))  # type: ignore[arg-type]

    def _admit(self, connection: socket.socket, hello: SeedHello, server_nonce: str, where: str) -> bytes | None:
        """The credential when ``hello`` proves it and asks for what this rank holds; None once refused."""
        if hello.version != SEED_PROTOCOL:
            self._refuse(connection, "version", f"this daemon speaks seed protocol {SEED_PROTOCOL}", where)
            return None
        try:
            key = read_credential(self.credential_file)
        except WeightCacheError as exc:
            self._refuse(connection, "credential", "the serving daemon cannot read its own credential", where)
            log.error("seed credential unreadable", extra={"fields": {**self.fields, "why": str(exc)}})
            return None
        if not proofs_equal(client_proof(key, hello, server_nonce), hello.proof):
            self._refuse(
                connection,
                "credential",
                "the proof does not match this cache's seeding credential (another cache's daemon, or a rotated "
                "Secret not yet seen by one side)",
                where,
            )
            return None
        fingerprint, _ = self.served.identity()
        if hello.rank != self.served.rank or hello.weights_digest != fingerprint.weights_digest:
            self._refuse(
                connection,
                "weights",
                f"this daemon holds rank {self.served.rank} with weights {fingerprint.weights_digest[:16]}…, "
                f"not rank {hello.rank} with {hello.weights_digest[:16]}…",
                where,
            )
            return None
        if hello.want == "chunks":
            with self._lock:
                if hello.session not in self._sessions:
                    self._refuse(connection, "session", "no seed of this session is open here", where)
                    return None
        return key

    def _offer(self, connection: socket.socket, hello: SeedHello, server_nonce: str, key: bytes, where: str) -> None:
        with self._lock:
            busy = len(self._sessions) >= self.max_clients
            if not busy:
                self._sessions[hello.session] = time.monotonic()
        if busy:
            send_frame(
                connection,
                SeedBusy(retry_after=1.0, detail=f"already seeding {self.max_clients} daemons (--seed-max-clients)"),
            )
            return
        try:
            fingerprint, manifest = self.served.identity()
            frame = encode(
                SeedOffer(
                    fingerprint=fingerprint,
                    manifest=manifest,
                    chunk_bytes=CHUNK_BYTES,
                    chunk_digests=self.chunk_digests(),
                )
            )
            send_frame(connection, frame)
            send_frame(connection, SeedProof(proof=server_proof(key, hello, server_nonce, frame[4:])))
            log.info("seeding", extra={"fields": {**self.fields, "peer": where, "session": hello.session[:8]}})
            # The session lasts while this connection is open and its chunks connections move bytes:
            # a client that closes it is done (or dead); one that keeps it open without asking for
            # bytes for RANGE_IDLE_S would hold a seeding slot for nothing, and loses it.
            connection.settimeout(1.0)
            while True:
                try:
                    if not connection.recv(1):
                        break
                except TimeoutError:
                    with self._lock:
                        idle = time.monotonic() - self._sessions.get(hello.session, 0.0)
                    if idle > RANGE_IDLE_S:
                        log.info("seed session idle; closed", extra={"fields": {**self.fields, "peer": where}})
                        break
            self.seeds_served += 1
        finally:
            with self._lock:
                self._sessions.pop(hello.session, None)

    def _send_ranges(self, connection: socket.socket, hello: SeedHello) -> None:
        arena = self.served.arena
        view = ArenaBytes(arena, arena.size)
        spans = chunk_spans(arena.size, CHUNK_BYTES)
        staging = view.staging(CHUNK_BYTES)
        # Under a low cap, blocks of a tenth of a second's bytes: a paced peer sends steadily
        # rather than a burst after a long silence (which a client would take for a stall).
        block_bytes = SEND_BLOCK if self.bucket.rate <= 0 else max(4096, min(SEND_BLOCK, int(self.bucket.rate / 10)))
        while True:
            body = recv_frame(connection, MAX_HELLO_BYTES, deadlines=Deadlines(RANGE_IDLE_S, HELLO_S))
            wanted = decode(RANGE, body)
            if wanted.first + wanted.count > len(spans):
                send_frame(connection, SeedRefused(reason="range", detail=f"the arena has {len(spans)} chunks"))
                return
            for offset, length in spans[wanted.first : wanted.first + wanted.count]:
                with self._lock:
                    if hello.session not in self._sessions:
                        return  # the seed's session ended: its client is gone
                data = view.readable(offset, length, staging)
                for start in range(0, length, block_bytes):
                    block = data[start : start + block_bytes]
                    self.bucket.take(len(block))
                    connection.sendall(block)
                    with self._lock:
                        self.bytes_sent += len(block)
                        if hello.session in self._sessions:
                            self._sessions[hello.session] = time.monotonic()
