import socket
import struct

import msgpack
import pytest
from weightcache.wire.protocol import REPLY, REQUEST, ErrorReply, Fetch, Hello, PeerClosed, decode, encode, recv_frame
from weightcache_contract.errors import ProtocolError


def test_requests_round_trip() -> None:
    for message in (Hello(versions=[1], client="x"), Fetch(fingerprint_digest="ab" * 32)):
        frame = encode(message)
        (length,) = struct.unpack(">I", frame[:4])
        assert length == len(frame) - 4
        assert decode(REQUEST, frame[4:]) == message


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\xc1\xc1\xc1", "not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "must hold a msgpack map"),
        (msgpack.packb({"type": "launch_missiles"}), "invalid message"),
        (msgpack.packb({"type": "hello", "versions": [1], "sneaky": 1}), "sneaky"),
        (msgpack.packb({"type": "hello", "versions": "one"}), "versions"),
        (msgpack.packb({"type": "fetch"}), "fingerprint_digest"),
    ],
)
def test_bad_requests_are_rejected_with_a_reason(payload: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        decode(REQUEST, payload)


def test_pickle_is_not_a_message() -> None:
    import pickle

    with pytest.raises(ProtocolError):
        decode(REQUEST, pickle.dumps({"type": "ping"}))


def test_frames_over_the_limit_are_refused_before_reading_the_body() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 2**31))
        with pytest.raises(ProtocolError, match="exceeds the 1024-byte limit"):
            recv_frame(b, 1024)


def test_truncated_frame_and_clean_close_are_told_apart() -> None:
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", 10) + b"abc")
    a.close()
    with pytest.raises(ProtocolError, match="after 3 of 10 bytes") as info:
        recv_frame(b, 1024)
    assert not isinstance(info.value, PeerClosed)
    c, d = socket.socketpair()
    c.close()
    with pytest.raises(PeerClosed):
        recv_frame(d, 1024)


def test_error_replies_decode() -> None:
    err = ErrorReply(code="busy", message="later")
    assert decode(REPLY, encode(err)[4:]) == err


@pytest.mark.parametrize(
    "payload, says",
    [
        (b"\x91" * 100_000 + b"\xc0", "nested too deeply"),  # a nesting bomb: msgpack's StackError has no text
        (b"\xc1", "starts no msgpack type"),
        (msgpack.packb({"type": "ping"}) + b"\x00", "bytes follow the first msgpack object"),
        (msgpack.packb({"type": "ping"})[:-2], "ends inside an object"),
        (msgpack.packb({1: 2}), "not allowed for map key"),
        (msgpack.packb({"versions": [1]}), "'type' names it"),
        (msgpack.packb("ping"), "not a string"),
    ],
)
def test_every_protocol_error_says_what_is_wrong(payload: bytes, says: str) -> None:
    with pytest.raises(ProtocolError) as info:
        decode(REQUEST, payload)
    text = str(info.value)
    assert says in text
    assert not text.rstrip().endswith(":"), f"error text ends in a bare colon: {text!r}"
