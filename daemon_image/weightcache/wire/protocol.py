"""The wire protocol between an engine and a daemon: framed, size-capped, schema-checked msgpack.

A frame is a 4-byte big-endian length followed by one msgpack map with a ``type`` key. Every
message is a pydantic model, so anything off-schema is rejected before it is acted on. There is
no pickle anywhere: whoever can write to the socket must not be able to run code in the daemon.
File descriptors travel only as SCM_RIGHTS ancillary data on the frame that announces them.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from weightcache_contract.daemon_report import CheckpointWatch
from weightcache_contract.errors import ProtocolError
from weightcache_contract.seeding import SeedReport

from ..checkpoints.manifest import Manifest
from .fingerprint import Fingerprint

SUPPORTED_VERSIONS = (1,)
MAX_REQUEST_BYTES = 64 * 1024  # what the daemon accepts: requests are tiny
MAX_REPLY_BYTES = 256 * 1024 * 1024  # what a client accepts: manifests of ~100k tensors fit
_HEADER = struct.Struct(">I")


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Requests (engine → daemon)
class Hello(_Message):
    type: Literal["hello"] = "hello"
    versions: list[int] = Field(max_length=16)
    client: str = Field(default="", max_length=256)


class QueryConfig(_Message):
    type: Literal["query_config"] = "query_config"


class Fetch(_Message):
    type: Literal["fetch"] = "fetch"
    fingerprint_digest: str = Field(max_length=128)


class Status(_Message):
    type: Literal["status"] = "status"


class Ping(_Message):
    type: Literal["ping"] = "ping"


# Replies (daemon → engine)
class HelloReply(_Message):
    type: Literal["hello_reply"] = "hello_reply"
    version: int
    daemon_version: str
    name: str
    rank: int


class ConfigReply(_Message):
    type: Literal["config_reply"] = "config_reply"
    fingerprint: Fingerprint
    fingerprint_digest: str
    backend: str
    arena_bytes: int
    tensor_count: int
    device_uuid: str | None = None


class CudaIpcHandle(_Message):
    """What torch's ``rebuild_cuda_tensor`` needs to open a legacy CUDA IPC allocation."""

    storage_handle: bytes
    storage_size_bytes: int
    storage_offset_bytes: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None = None
    event_sync_required: bool = False


class FetchReply(_Message):
    """Sent with the arena fd attached (SCM_RIGHTS) for fd-based backends; ``ipc`` otherwise."""

    type: Literal["fetch_reply"] = "fetch_reply"
    backend: str
    manifest: Manifest
    mapping_bytes: int  # the allocation's size, ≥ manifest.arena_bytes (GPU granularity)
    device_uuid: str | None = None
    ipc: CudaIpcHandle | None = None


class StatusReply(_Message):
    type: Literal["status_reply"] = "status_reply"
    pid: int
    name: str
    rank: int
    backend: str
    fingerprint_digest: str
    arena_bytes: int
    tensor_count: int
    load_seconds: float
    disk_bytes_read: int
    uptime_seconds: float
    connections_total: int
    connections_active: int
    fetches_total: int
    errors_total: int
    device_uuid: str | None = None
    adopted: bool = False  # re-adopted from the keeper: no disk read this life
    deposited: bool = False  # the keeper holds this arena now
    weights_digest: str = ""  # Fingerprint.weights_digest: comparable across nodes (fingerprint_digest is not)
    checkpoint: CheckpointWatch | None = None  # the checkpoint on disk against the arena (daemon/watch.py)
    seed: SeedReport | None = None  # how a peer served the arena, or why the disk did (seeding/client.py)


class Pong(_Message):
    type: Literal["pong"] = "pong"


class ErrorReply(_Message):
    type: Literal["error"] = "error"
    code: Literal[
        "bad_frame",
        "bad_message",
        "out_of_order",
        "version_mismatch",
        "fingerprint_mismatch",
        "forbidden",
        "busy",
        "internal",
        "not_found",
        "timeout",
    ]
    message: str
    fields: list[str] = []


# Keeper (daemon → keeper): hand an arena over, take it back, release it, list what is held.
class Deposit(_Message):
    """Sent with the arena fd attached."""

    type: Literal["deposit"] = "deposit"
    name: str = Field(max_length=63)
    rank: int
    fingerprint_digest: str = Field(max_length=128)
    backend: str
    mapping_bytes: int
    device_uuid: str | None = None
    manifest: Manifest
    fingerprint: Fingerprint | None = None
    """What the arena was loaded for: lets a daemon restarted after an equal-bytes rewrite of a shard
    verify and re-adopt it under the new stamps (daemon/rank.py)."""


class Withdraw(_Message):
    type: Literal["withdraw"] = "withdraw"
    name: str = Field(max_length=63)
    rank: int
    fingerprint_digest: str = Field(max_length=128)


class Release(_Message):
    type: Literal["release"] = "release"
    name: str = Field(max_length=63)
    rank: int | None = None  # None: every rank of the cache


class ListHoldings(_Message):
    type: Literal["list_holdings"] = "list_holdings"


class Holding(_Message):
    name: str
    rank: int
    fingerprint_digest: str
    backend: str
    mapping_bytes: int
    device_uuid: str | None = None
    tensor_count: int
    deposited_at: float


class KeeperAck(_Message):
    type: Literal["keeper_ack"] = "keeper_ack"
    released: int = 0


class Withdrawn(_Message):
    """Sent with the arena fd attached."""

    type: Literal["withdrawn"] = "withdrawn"
    holding: Holding
    manifest: Manifest
    fingerprint: Fingerprint | None = None


class Holdings(_Message):
    type: Literal["holdings"] = "holdings"
    entries: list[Holding]


Request = Annotated[Hello | QueryConfig | Fetch | Status | Ping, Field(discriminator="type")]
KeeperRequest = Annotated[Hello | Deposit | Withdraw | Release | ListHoldings | Ping, Field(discriminator="type")]
Reply = Annotated[
    HelloReply | ConfigReply | FetchReply | StatusReply | Pong | ErrorReply | KeeperAck | Withdrawn | Holdings,
    Field(discriminator="type"),
]
REQUEST = TypeAdapter(Request)
KEEPER_REQUEST = TypeAdapter(KeeperRequest)
REPLY = TypeAdapter(Reply)


def encode(message: BaseModel) -> bytes:
    body: bytes = msgpack.packb(message.model_dump(mode="python"), use_bin_type=True)
    return _HEADER.pack(len(body)) + body


def decode(adapter: TypeAdapter[Any], body: bytes) -> Any:
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"frame is not valid msgpack: {_msgpack_error_text(exc)}") from None
    if not isinstance(raw, dict):
        raise ProtocolError(f"frame must hold a msgpack map with a 'type' key, not {_kind(raw)}")
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        if not where:  # the discriminator itself: no field to name
            raise ProtocolError(
                f"invalid message: {first['msg']} (every message is a map whose 'type' names it)"
            ) from None
        raise ProtocolError(f"invalid message ({where}: {first['msg']})") from None


def _msgpack_error_text(exc: Exception) -> str:
    """What went wrong, in words: several msgpack exceptions carry no message at all."""
    if isinstance(exc, msgpack.StackError):
        return "it is nested too deeply for the decoder (every message is a flat map of a few levels)"
    if isinstance(exc, msgpack.FormatError):
        return "it holds a byte that starts no msgpack type (e.g. the reserved 0xc1)"
    if isinstance(exc, msgpack.ExtraData):
        return "bytes follow the first msgpack object; a frame holds exactly one"
    text = str(exc)
    if "incomplete input" in text:
        return "it ends inside an object (truncated or mis-framed)"
    return text or f"the decoder raised {type(exc).__name__} without a message"


def _kind(value: object) -> str:
    return {list: "an array", str: "a string", bytes: "binary data", type(None): "nil"}.get(
        type(value), f"a {type(value).__name__}"
    )


class PeerClosed(ProtocolError):
    """The peer closed the connection cleanly between frames."""


class PeerTimeout(ProtocolError):
    """The peer did not send what it owed in time: a server's ``Deadlines`` ran out."""


@dataclass(frozen=True)
class Deadlines:
    """How long a server waits on a peer. Each ``recv`` having its own timeout is not enough: a
    peer trickling one byte per interval would hold its connection forever."""

    idle_s: float  # for the first byte of the next frame
    frame_s: float  # for the rest of a frame, counted from its first byte
    hello_by: float | None = None  # time.monotonic() by which a hello must be complete (None once greeted)
    hello_s: float = 0.0  # the hello allowance, for the error text


def _recv_exact(
    sock: socket.socket, n: int, fds: list[int] | None, until: tuple[float, str] | None, between_frames: bool = False
) -> bytes:
    """Exactly ``n`` bytes; ``until`` = (monotonic deadline, what to say when it passes)."""
    chunks, got = [], 0
    while got < n:
        if until is not None:
            remaining = until[0] - time.monotonic()
            if remaining <= 0:
                raise PeerTimeout(until[1] if n == 1 else f"{until[1]} ({got} of {n} bytes arrived)")
            sock.settimeout(remaining)
        try:
            if fds is not None and not fds:
                data, received, _flags, _addr = socket.recv_fds(sock, n - got, 4)
                fds.extend(received)
            else:
                data = sock.recv(n - got)
        except TimeoutError:
            if until is None:
                raise
            continue  # the check above says which deadline passed
        if not data:
            if between_frames and got == 0:
                raise PeerClosed("peer closed the connection")
            raise ProtocolError(f"peer closed the connection after {got} of {n} bytes")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def _earliest(*limits: tuple[float, str] | None) -> tuple[float, str] | None:
    present = [limit for limit in limits if limit is not None]
    return min(present, key=lambda limit: limit[0]) if present else None


def recv_frame(
    sock: socket.socket, max_bytes: int, fds: list[int] | None = None, deadlines: Deadlines | None = None
) -> bytes:
    """One frame's body; with ``fds`` given, any SCM_RIGHTS fds that arrive are appended to it.

    Without ``deadlines`` the socket's own timeout bounds each ``recv`` (what a client wants).
    """
    hello = None
    if deadlines is not None and deadlines.hello_by is not None:
        hello = (
            deadlines.hello_by,
            f"no hello within {deadlines.hello_s:.1f} s of connecting; a client must say hello first",
        )
    idle = (
        None
        if deadlines is None
        else (
            time.monotonic() + deadlines.idle_s,
            f"no request for {deadlines.idle_s:.1f} s; idle connections are closed",
        )
    )
    first = _recv_exact(sock, 1, fds, _earliest(idle, hello), between_frames=True)
    frame = None
    if deadlines is not None:
        frame = (
            time.monotonic() + deadlines.frame_s,
            f"frame not complete within {deadlines.frame_s:.1f} s of its first byte; the peer sends too slowly",
        )
    until = _earliest(frame, hello)
    (length,) = _HEADER.unpack(first + _recv_exact(sock, _HEADER.size - 1, fds, until))
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return _recv_exact(sock, length, fds, until)


def send_frame(sock: socket.socket, message: BaseModel | bytes, fds: list[int] | None = None) -> None:
    """Send one message (or an already encoded frame), with fds attached to its first byte."""
    data = message if isinstance(message, bytes) else encode(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)
