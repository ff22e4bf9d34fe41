"""A starting rank copying its arena from a Ready peer, or saying why it could not.

``seed_rank`` tries the peers the operator listed (``--seed-peers-file``) that hold this rank with
these weights, in order. One attempt: the handshake (both sides prove the credential), the offer
(authenticated, and its layout checked against this rank's own plan), then ``streams``
connections receiving contiguous runs of chunks straight into the new arena, each chunk hashed
and compared as it completes. Any refusal, mismatch, death, stall (nothing for ``stall_s``) or
trickle (less than ``min_bytes_per_s`` over ``stall_s``) ends the attempt, and the next peer is
tried; all busy peers are asked again (and the peers file re-read: a node seeded meanwhile is a
seed too) until ``busy_wait_s`` has passed. The caller loads from the disk when no seed came,
with the reason in ``SeedResult.report``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError
from weightcache_contract.errors import ProtocolError, WeightCacheError
from weightcache_contract.seeding import SeedPeer, SeedPeers, SeedReport

from ..checkpoints.manifest import Manifest, TensorEntry
from ..wire.protocol import Deadlines, decode, recv_frame, send_frame
from .arena_bytes import ArenaBytes, chunk_spans
from .messages import (
    MAX_HELLO_BYTES,
    MAX_OFFER_BYTES,
    SEED_PROTOCOL,
    SERVER_MESSAGE,
    SeedBusy,
    SeedChallenge,
    SeedHello,
    SeedOffer,
    SeedProof,
    SeedRange,
    SeedRefused,
    client_proof,
    nonce,
    proofs_equal,
    read_credential,
    server_proof,
)

if TYPE_CHECKING:
    from ..arenas.arena import Arena
    from ..wire.fingerprint import Fingerprint

log = logging.getLogger("weightcache.seeding")

MIN_CHUNK_BYTES = 2**20
MAX_CHUNK_BYTES = 2**30


@dataclass(frozen=True)
class SeedSettings:
    peers_file: str
    credential_file: str
    node_name: str | None = None
    streams: int = 4
    stall_s: float = 10.0
    min_bytes_per_s: float = 2**20
    busy_wait_s: float | None = None
    """How long to keep asking busy peers; default: 12 stalls."""


@dataclass
class SeedResult:
    arena: Arena | None
    manifest: Manifest | None
    report: SeedReport
    chunk_digests: list[str] | None = None


class SeedFailed(Exception):
    """This attempt is over; the text says why, for the rank's report."""


class _Busy(SeedFailed):
    def __init__(self, retry_after: float, text: str) -> None:
        super().__init__(text)
        self.retry_after = retry_after


def read_peers(path: str) -> SeedPeers:
    """The peers file; an absent one (the operator has not written it yet) lists no peers."""
    try:
        return SeedPeers.model_validate_json(Path(path).read_bytes())
    except FileNotFoundError:
        return SeedPeers()
    except (OSError, ValidationError, ValueError) as exc:
        log.warning(
            "peers file unreadable; loading from the disk", extra={"fields": {"file": path, "why": str(exc)[:300]}}
        )
        return SeedPeers()


def candidates(settings: SeedSettings, rank: int, fingerprint: Fingerprint) -> list[SeedPeer]:
    return read_peers(settings.peers_file).candidates(rank, fingerprint.weights_digest, settings.node_name)


@dataclass(frozen=True)
class Expected:
    """What this rank would load, for checking an offer against.

    ``planned`` is the rank's own plan (the reference loader plans from the checkpoint's headers):
    the offer must place every tensor exactly so. An engine profile whose layout only its engine's
    loading produces (vLLM's post-processing) has no plan: ``planned`` is None, the offer's
    manifest is taken from the authenticated peer with the same weights digest (which covers the
    engine's version and every setting that changes the bytes), checked for bounds, and its size
    must stay under ``max_arena_bytes``; an engine's binding refuses tensors for modules its model
    lacks, and model tensors the arena does not hold."""

    fingerprint: Fingerprint
    planned: list[TensorEntry] | None
    arena_bytes: int | None
    max_arena_bytes: int | None = None


def seed_rank(
    settings: SeedSettings,
    rank: int,
    expected: Expected,
    make_arena: Callable[[int], Arena],
    fields: dict[str, Any] | None = None,
) -> SeedResult | None:
    """The arena from a peer, or the reason none came; None when no peer holds this rank's weights.

    ``make_arena`` is called once an offer verified, with its size."""
    fields = fields or {}
    fingerprint = expected.fingerprint
    peers = candidates(settings, rank, fingerprint)
    if not peers:
        return None
    began = time.monotonic()
    busy_until = began + (settings.busy_wait_s if settings.busy_wait_s is not None else 12 * settings.stall_s)
    attempts: list[str] = []
    while True:
        waits: list[float] = []
        for peer in peers:
            where = f"{peer.node} ({peer.address}:{peer.rank_port(rank)})"
            attempt = _Attempt(settings, peer, rank, expected, make_arena)
            try:
                attempt_began = time.monotonic()
                manifest, digests = attempt.run()
                seconds = time.monotonic() - attempt_began
                size = manifest.arena_bytes
                attempts.append(f"{peer.node}: served {size} bytes in {seconds:.2f} s")
                log.info(
                    "seeded from peer",
                    extra={"fields": {**fields, "peer": peer.node, "bytes": size, "seconds": f"{seconds:.2f}"}},
                )
                report = SeedReport(peer=peer.node, bytes=size, seconds=seconds, attempts=attempts)
                return SeedResult(attempt.arena, manifest, report, digests)
            except _Busy as busy:
                waits.append(busy.retry_after)
                attempts.append(f"{peer.node}: busy ({busy})")
            except (SeedFailed, ProtocolError, OSError, WeightCacheError) as exc:
                attempts.append(f"{peer.node}: {exc}")
                log.warning("seed attempt failed", extra={"fields": {**fields, "peer": where, "why": str(exc)}})
            if attempt.arena is not None:
                attempt.arena.close()
        if not waits or time.monotonic() + min(waits) > busy_until:
            break
        time.sleep(min(waits))
        peers = candidates(settings, rank, fingerprint) or peers
    seconds = time.monotonic() - began
    reason = "; ".join(attempts[-8:])
    return SeedResult(None, None, SeedReport(seconds=seconds, fallback=reason, attempts=attempts[-32:]))


# -- one attempt ---------------------------------------------------------------------------------


def _connect(settings: SeedSettings, peer: SeedPeer, rank: int) -> socket.socket:
    try:
        connection = socket.create_connection((peer.address, peer.rank_port(rank)), timeout=settings.stall_s)
    except TimeoutError:
        raise SeedFailed(f"no connection within {settings.stall_s:.0f} s") from None
    except OSError as exc:
        raise SeedFailed(f"cannot connect: {exc.strerror or exc}") from None
    connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _receive(connection: socket.socket, settings: SeedSettings, max_bytes: int) -> tuple[object, bytes]:
    try:
        body = recv_frame(connection, max_bytes, deadlines=Deadlines(settings.stall_s, max(4 * settings.stall_s, 30.0)))
    except TimeoutError:
        raise SeedFailed(f"the peer sent nothing for {settings.stall_s:.0f} s") from None
    return decode(SERVER_MESSAGE, body), body


def _expect(message: object, kind: type) -> Any:
    if isinstance(message, SeedRefused):
        raise SeedFailed(f"refused ({message.reason}): {message.detail}")
    if isinstance(message, SeedBusy):
        raise _Busy(message.retry_after, message.detail)
    if not isinstance(message, kind):
        raise SeedFailed(f"the peer sent {getattr(message, 'type', message)!r} where {kind.__name__} belongs")
    return message


def _hello(
    connection: socket.socket,
    settings: SeedSettings,
    key: bytes,
    want: Literal["offer", "chunks"],
    rank: int,
    weights: str,
    session: str,
) -> tuple[SeedHello, str]:
    challenge: SeedChallenge = _expect(_receive(connection, settings, MAX_HELLO_BYTES)[0], SeedChallenge)
    unsigned = SeedHello(
        version=SEED_PROTOCOL,
        want=want,
        rank=rank,
        weights_digest=weights,
        session=session,
        nonce=nonce(),
        proof="0" * 64,
    )
    hello = unsigned.model_copy(update={"proof": client_proof(key, unsigned, challenge.nonce)})
    send_frame(connection, hello)
    return hello, challenge.nonce


def _check_proof(proof: SeedProof, key: bytes, hello: SeedHello, server_nonce: str, offer_body: bytes) -> None:
    if not proofs_equal(server_proof(key, hello, server_nonce, offer_body), proof.proof):
        raise SeedFailed("the peer's proof does not match this cache's credential: it is not a daemon of this cache")


def _check_offer(offer: SeedOffer, expected: Expected) -> int:
    """The offer describes the arena this rank would load: same weights, same layout (or, without
    a plan, a manifest within bounds and a size within ``max_arena_bytes``). Returns its size."""
    fingerprint = expected.fingerprint
    if offer.fingerprint.weights_digest != fingerprint.weights_digest:
        differences = ", ".join(offer.fingerprint.differences(fingerprint)) or "its digest"
        raise SeedFailed(f"the peer holds other weights (differs in {differences})")
    manifest = offer.manifest
    if expected.arena_bytes is not None and manifest.arena_bytes != expected.arena_bytes:
        raise SeedFailed(f"the peer's arena is {manifest.arena_bytes} bytes; this rank plans {expected.arena_bytes}")
    if expected.max_arena_bytes is not None and manifest.arena_bytes > expected.max_arena_bytes:
        raise SeedFailed(
            f"the peer offers a {manifest.arena_bytes}-byte arena, more than this rank could hold from its "
            f"checkpoint ({expected.max_arena_bytes} bytes at most)"
        )
    try:
        manifest.validate_bounds()
    except ProtocolError as exc:
        raise SeedFailed(f"the peer's manifest is malformed: {exc}") from None
    if expected.planned is not None:
        theirs = {e.name: e.model_copy(update={"checksum": 0}) for e in manifest.entries()}
        ours = {e.name: e.model_copy(update={"checksum": 0}) for e in expected.planned}
        if theirs != ours:
            differ = sorted(name for name in theirs.keys() | ours.keys() if theirs.get(name) != ours.get(name))
            raise SeedFailed(
                f"the peer's manifest places {len(differ)} tensors otherwise than this rank's plan, e.g. {differ[0]}"
            )
    if not MIN_CHUNK_BYTES <= offer.chunk_bytes <= MAX_CHUNK_BYTES:
        raise SeedFailed(f"the peer offers chunks of {offer.chunk_bytes} bytes")
    if len(offer.chunk_digests) != math.ceil(manifest.arena_bytes / offer.chunk_bytes):
        raise SeedFailed(
            f"the peer offers {len(offer.chunk_digests)} chunk digests for a {manifest.arena_bytes}-byte arena"
        )
    return manifest.arena_bytes


class _Attempt:
    """One peer: the verified offer, then the arena (made only now, at the offer's size) filled."""

    def __init__(
        self,
        settings: SeedSettings,
        peer: SeedPeer,
        rank: int,
        expected: Expected,
        make_arena: Callable[[int], Arena],
    ) -> None:
        self.settings, self.peer, self.rank, self.expected, self.make_arena = settings, peer, rank, expected, make_arena
        self.arena: Arena | None = None

    def run(self) -> tuple[Manifest, list[str]]:
        settings, peer, rank = self.settings, self.peer, self.rank
        key = read_credential(settings.credential_file)
        session = os.urandom(16).hex()
        fingerprint = self.expected.fingerprint
        weights = fingerprint.weights_digest
        control = _connect(settings, peer, rank)
        try:
            hello, server_nonce = _hello(control, settings, key, "offer", rank, weights, session)
            message, body = _receive(control, settings, MAX_OFFER_BYTES)
            offer: SeedOffer = _expect(message, SeedOffer)
            _check_proof(
                _expect(_receive(control, settings, MAX_HELLO_BYTES)[0], SeedProof), key, hello, server_nonce, body
            )
            size = _check_offer(offer, self.expected)
            self.arena = self.make_arena(size)
            _Transfer(settings, peer, rank, key, weights, session, offer, ArenaBytes(self.arena, size)).run()
        finally:
            control.close()
        self.arena.seal()
        return offer.manifest.model_copy(update={"fingerprint_digest": fingerprint.digest}), offer.chunk_digests


class _Transfer:
    """``streams`` connections, each receiving one contiguous run of chunks and hashing each as it
    completes; a watchdog ends them all on the first failure, or when they all together trickle."""

    def __init__(
        self,
        settings: SeedSettings,
        peer: SeedPeer,
        rank: int,
        key: bytes,
        weights: str,
        session: str,
        offer: SeedOffer,
        target: ArenaBytes,
    ) -> None:
        self.settings, self.peer, self.rank, self.key = settings, peer, rank, key
        self.weights, self.session, self.offer, self.target = weights, session, offer, target
        self.spans = chunk_spans(target.size, offer.chunk_bytes)
        self.received = 0
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []

    def run(self) -> None:
        streams = max(1, min(self.settings.streams, len(self.spans)))
        per = math.ceil(len(self.spans) / streams)
        runs = [(first, min(per, len(self.spans) - first)) for first in range(0, len(self.spans), per)]
        threads = [threading.Thread(target=self._stream, args=run, daemon=True, name="seed-stream") for run in runs]
        for thread in threads:
            thread.start()
        window_start, window_bytes = time.monotonic(), 0
        while any(t.is_alive() for t in threads):
            time.sleep(0.05)
            if self.failure is not None:
                break
            now = time.monotonic()
            if now - window_start >= self.settings.stall_s:
                moved = self.received - window_bytes
                if moved < self.settings.min_bytes_per_s * (now - window_start):
                    self._fail(
                        f"the peer sent {moved / 2**20:.2f} MiB in {now - window_start:.0f} s, slower than "
                        f"{self.settings.min_bytes_per_s / 2**20:.2f} MiB/s (--seed-min-mib-s)"
                    )
                    break
                window_start, window_bytes = now, self.received
        for thread in threads:
            thread.join(self.settings.stall_s + 1)
        if self.failure is not None:
            raise SeedFailed(self.failure)
        if self.received != self.target.size:
            raise SeedFailed(f"{self.received} of {self.target.size} bytes arrived")

    def _fail(self, text: str) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = text
            sockets = list(self._sockets)
        for connection in sockets:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _stream(self, first: int, count: int) -> None:
        try:
            connection = _connect(self.settings, self.peer, self.rank)
        except SeedFailed as exc:
            self._fail(str(exc))
            return
        with self._lock:
            self._sockets.append(connection)
            if self.failure is not None:
                connection.close()
                return
        try:
            hello, server_nonce = _hello(
                connection, self.settings, self.key, "chunks", self.rank, self.weights, self.session
            )
            _check_proof(
                _expect(_receive(connection, self.settings, MAX_HELLO_BYTES)[0], SeedProof),
                self.key,
                hello,
                server_nonce,
                b"",
            )
            send_frame(connection, SeedRange(first=first, count=count))
            connection.settimeout(self.settings.stall_s)
            staging = self.target.staging(self.offer.chunk_bytes)
            for index in range(first, first + count):
                offset, length = self.spans[index]
                view = self.target.writable(offset, length, staging)
                got = 0
                while got < length:
                    try:
                        n = connection.recv_into(view[got:], length - got)
                    except TimeoutError:
                        raise SeedFailed(f"the peer sent nothing for {self.settings.stall_s:.0f} s") from None
                    if n == 0:
                        raise SeedFailed(f"the peer closed the connection in chunk {index} ({got} of {length} bytes)")
                    got += n
                    with self._lock:
                        self.received += n
                if hashlib.sha256(view).hexdigest() != self.offer.chunk_digests[index]:
                    raise SeedFailed(
                        f"chunk {index} (bytes {offset}–{offset + length}) does not match the digest the peer offered; "
                        "its copy is discarded"
                    )
                self.target.commit(offset, length, staging)
        except (SeedFailed, ProtocolError) as exc:
            self._fail(str(exc))
        except OSError as exc:
            self._fail(self.failure or f"the connection failed: {exc.strerror or exc}")
        finally:
            connection.close()
