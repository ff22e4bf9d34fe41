"""The seed protocol's messages and the credential's proofs.

One TCP connection opens with the server's challenge (a fresh nonce); the client answers with its
hello (its own nonce, the rank and weights it wants, and an HMAC proving it holds the credential);
the server then proves the same, over both nonces and the exact bytes of its offer. An ``offer``
connection receives the offer (fingerprint, manifest, chunk digests) and stays open as the seed's
session; ``chunks`` connections of the same session then ask for ranges of chunks, which arrive as
raw bytes, no framing, in order. Frames are the wire protocol's (length-prefixed msgpack, pydantic
validated, size-capped): no pickle here either.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, TypeAdapter
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.seeding import CREDENTIAL_MIN_BYTES

from ..checkpoints.manifest import Manifest
from ..wire.fingerprint import Fingerprint
from ..wire.protocol import _Message

SEED_PROTOCOL = 1
NONCE_BYTES = 32
MAX_HELLO_BYTES = 4096
MAX_OFFER_BYTES = 256 * 1024 * 1024
"""A manifest of ~100k tensors and the digests of a 1 TB arena's chunks fit."""
CHUNK_BYTES = 16 * 2**20
"""What one digest covers: small enough that a bad byte costs little to notice, large enough that
a 100 GB rank's digest list stays a few hundred kilobytes."""

_hex64 = Field(min_length=64, max_length=64, pattern="^[0-9a-f]+$")


class SeedChallenge(_Message):
    type: Literal["seed_challenge"] = "seed_challenge"
    version: int
    nonce: str = _hex64


class SeedHello(_Message):
    type: Literal["seed_hello"] = "seed_hello"
    version: int
    want: Literal["offer", "chunks"]
    rank: int = Field(ge=0)
    weights_digest: str = Field(max_length=128)
    session: str = Field(min_length=32, max_length=32, pattern="^[0-9a-f]+$")
    nonce: str = _hex64
    proof: str = _hex64


class SeedRange(_Message):
    type: Literal["seed_range"] = "seed_range"
    first: int = Field(ge=0)
    count: int = Field(ge=1)


class SeedOffer(_Message):
    type: Literal["seed_offer"] = "seed_offer"
    fingerprint: Fingerprint
    manifest: Manifest
    chunk_bytes: int = Field(gt=0)
    chunk_digests: list[str]


class SeedProof(_Message):
    """The server's proof: HMAC over both nonces and the digest of the offer frame sent just before
    it (of nothing, on a ``chunks`` connection)."""

    type: Literal["seed_proof"] = "seed_proof"
    proof: str = _hex64


class SeedBusy(_Message):
    type: Literal["seed_busy"] = "seed_busy"
    retry_after: float = Field(ge=0)
    detail: str = ""


class SeedRefused(_Message):
    type: Literal["seed_refused"] = "seed_refused"
    reason: Literal["credential", "weights", "version", "session", "range", "bad_request"]
    detail: str = ""


HELLO = TypeAdapter(SeedHello)
RANGE = TypeAdapter(SeedRange)
SERVER_MESSAGE = TypeAdapter(
    Annotated[SeedChallenge | SeedOffer | SeedProof | SeedBusy | SeedRefused, Field(discriminator="type")]
)


def nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def client_proof(key: bytes, hello: SeedHello, server_nonce: str) -> str:
    text = f"client|{server_nonce}|{hello.nonce}|{hello.want}|{hello.rank}|{hello.weights_digest}|{hello.session}"
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def server_proof(key: bytes, hello: SeedHello, server_nonce: str, offer_frame: bytes) -> str:
    """Binds the offer's exact bytes to this connection: a recorded offer replayed on another
    connection, or one from a server without the key, does not verify."""
    offer = hashlib.sha256(offer_frame).hexdigest()
    text = f"server|{hello.nonce}|{server_nonce}|{hello.session}|{offer}"
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def proofs_equal(expected: str, given: str) -> bool:
    return hmac.compare_digest(expected.encode(), given.encode())


def read_credential(path: str) -> bytes:
    """The cache's seeding credential, read anew at every handshake: a rotated Secret takes effect
    without restarting the daemon. Refuses a key too short to be one. The bytes are the key as
    they are (no stripping: a random key may end in what looks like whitespace)."""
    try:
        key = Path(path).read_bytes()
    except OSError as exc:
        raise WeightCacheError(
            f"cannot read the seeding credential {path}: {exc.strerror}; mount the cache's seeding Secret there"
        ) from None
    if len(key) < CREDENTIAL_MIN_BYTES:
        raise WeightCacheError(
            f"the seeding credential {path} holds {len(key)} bytes; it needs at least {CREDENTIAL_MIN_BYTES} "
            "(the operator's Secret holds 32 random bytes)"
        )
    return key
