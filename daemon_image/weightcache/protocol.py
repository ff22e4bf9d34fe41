"""The wire protocol between an engine and a daemon: framed, size-capped, schema-checked msgpack.

A frame is a 4-byte big-endian length followed by one msgpack map with a ``type`` key. Every
message is a pydantic model, so anything off-schema is rejected before it is acted on. There is
no pickle anywhere: whoever can write to the socket must not be able to run code in the daemon.
File descriptors travel only as SCM_RIGHTS ancillary data on the frame that announces them.
"""

from __future__ import annotations

import socket
import struct
from typing import Annotated, Any, Literal, Union

import msgpack
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import ProtocolError
from .fingerprint import PROTOCOL_VERSION, Fingerprint
from .manifest import Manifest

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


class FetchReply(_Message):
    """Sent with the arena fd attached (SCM_RIGHTS)."""

    type: Literal["fetch_reply"] = "fetch_reply"
    backend: str
    manifest: Manifest


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


class Pong(_Message):
    type: Literal["pong"] = "pong"


class ErrorReply(_Message):
    type: Literal["error"] = "error"
    code: Literal[
        "bad_frame", "bad_message", "out_of_order", "version_mismatch", "fingerprint_mismatch", "forbidden",
        "busy", "internal",
    ]
    message: str
    fields: list[str] = []


Request = Annotated[Union[Hello, QueryConfig, Fetch, Status, Ping], Field(discriminator="type")]
Reply = Annotated[
    Union[HelloReply, ConfigReply, FetchReply, StatusReply, Pong, ErrorReply], Field(discriminator="type")
]
REQUEST = TypeAdapter(Request)
REPLY = TypeAdapter(Reply)


def encode(message: BaseModel) -> bytes:
    body = msgpack.packb(message.model_dump(mode="python"), use_bin_type=True)
    return _HEADER.pack(len(body)) + body


def decode(adapter: TypeAdapter[Any], body: bytes) -> Any:
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"frame is not valid msgpack: {exc}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("frame must hold a msgpack map")
    try:
        return adapter.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ProtocolError(f"invalid message ({where}: {first['msg']})") from None


class PeerClosed(ProtocolError):
    """The peer closed the connection cleanly between frames."""


def _recv_exact(sock: socket.socket, n: int, fds: list[int] | None = None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if fds is not None and not fds:
            data, received, _flags, _addr = socket.recv_fds(sock, n - got, 4)
            fds.extend(received)
        else:
            data = sock.recv(n - got)
        if not data:
            if got == 0 and n == _HEADER.size:
                raise PeerClosed("peer closed the connection")
            raise ProtocolError(f"peer closed the connection after {got} of {n} bytes")
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


def recv_frame(sock: socket.socket, max_bytes: int, fds: list[int] | None = None) -> bytes:
    """One frame's body; with ``fds`` given, any SCM_RIGHTS fds that arrive are appended to it."""
    (length,) = _HEADER.unpack(_recv_exact(sock, _HEADER.size, fds))
    if length > max_bytes:
        raise ProtocolError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return _recv_exact(sock, length, fds)


def send_frame(sock: socket.socket, message: BaseModel | bytes, fds: list[int] | None = None) -> None:
    """Send one message (or an already encoded frame), with fds attached to its first byte."""
    data = message if isinstance(message, bytes) else encode(message)
    if fds:
        sent = socket.send_fds(sock, [data], fds)
        data = data[sent:]
    if data:
        sock.sendall(data)
