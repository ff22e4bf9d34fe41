"""The seed port from an attacker's side: garbage, a wrong proof, a made-up session, a range past
the end, a silent connection, one seed too many. Each gets a clear refusal or is closed, no byte
of weights leaves the server, and a rightful seed afterwards still works."""

from __future__ import annotations

import os
import socket

import pytest
from seeding_builders import free_port, served_copy
from weightcache.seeding import messages as m
from weightcache.seeding import server as seed_server
from weightcache.seeding.server import SeedServer
from weightcache.wire.protocol import decode, recv_frame, send_frame


@pytest.fixture
def serving(llama, start_daemon, credential, tmp_path, monkeypatch):
    monkeypatch.setattr(seed_server, "HELLO_S", 1.0)
    key_file = credential()
    source = start_daemon(llama, name="door", dtype="bfloat16", keeper="off", socket_dir_override=str(tmp_path / "s"))
    served = served_copy(source, "door")
    server = SeedServer(served, ("127.0.0.1", free_port()), key_file, max_clients=1).start()
    yield server, open(key_file, "rb").read(), served
    server.stop()


def connect(server: SeedServer) -> tuple[socket.socket, m.SeedChallenge]:
    s = socket.create_connection(server.address, timeout=5)
    challenge = decode(m.SERVER_MESSAGE, recv_frame(s, m.MAX_HELLO_BYTES))
    assert isinstance(challenge, m.SeedChallenge)
    return s, challenge


def hello(key: bytes, challenge: m.SeedChallenge, served, want="offer", session=None, proof=None) -> m.SeedHello:
    unsigned = m.SeedHello(
        version=m.SEED_PROTOCOL,
        want=want,
        rank=0,
        weights_digest=served.fingerprint.weights_digest,
        session=session or os.urandom(16).hex(),
        nonce=m.nonce(),
        proof="0" * 64,
    )
    return unsigned.model_copy(update={"proof": proof or m.client_proof(key, unsigned, challenge.nonce)})


def answer(s: socket.socket) -> object:
    return decode(m.SERVER_MESSAGE, recv_frame(s, m.MAX_OFFER_BYTES))


def closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True


def rightful_seed_works(server: SeedServer, key: bytes, served) -> None:
    s, challenge = connect(server)
    with s:
        sent = hello(key, challenge, served)
        send_frame(s, sent)
        offer_body = recv_frame(s, m.MAX_OFFER_BYTES)
        assert isinstance(decode(m.SERVER_MESSAGE, offer_body), m.SeedOffer)
        proof = answer(s)
        assert m.proofs_equal(m.server_proof(key, sent, challenge.nonce, offer_body), proof.proof)


def test_garbage_and_a_silent_connection_are_closed_and_the_port_still_serves(serving) -> None:
    server, key, served = serving
    s, _ = connect(server)
    s.sendall(b"\xff" * 64 + b"GET / HTTP/1.1\r\n\r\n")
    assert closed(s)
    silent, _ = connect(server)
    assert closed(silent)  # within the (shortened) hello allowance
    rightful_seed_works(server, key, served)
    assert server.bytes_sent == 0


def test_a_wrong_proof_is_refused_without_an_offer(serving) -> None:
    server, key, served = serving
    s, challenge = connect(server)
    send_frame(s, hello(os.urandom(32), challenge, served))
    refused = answer(s)
    assert isinstance(refused, m.SeedRefused) and refused.reason == "credential"
    assert closed(s)
    # A proof made for another challenge (a replay) is refused too.
    other, other_challenge = connect(server)
    replayed = hello(key, challenge, served)
    send_frame(other, replayed)
    assert answer(other).reason == "credential"
    assert server.refused == 2 and server.bytes_sent == 0


def test_chunks_need_an_open_session_and_a_range_inside_the_arena(serving) -> None:
    server, key, served = serving
    s, challenge = connect(server)
    send_frame(s, hello(key, challenge, served, want="chunks"))
    assert answer(s).reason == "session"

    control, challenge = connect(server)
    opened = hello(key, challenge, served)
    send_frame(control, opened)
    assert isinstance(answer(control), m.SeedOffer)
    answer(control)
    data, challenge = connect(server)
    send_frame(data, hello(key, challenge, served, want="chunks", session=opened.session))
    assert isinstance(answer(data), m.SeedProof)
    send_frame(data, m.SeedRange(first=10**6, count=1))
    assert answer(data).reason == "range"
    assert server.bytes_sent == 0
    control.close()


def test_one_seed_too_many_is_told_to_come_back_and_gets_its_turn(serving) -> None:
    server, key, served = serving
    first, challenge = connect(server)
    send_frame(first, hello(key, challenge, served))
    assert isinstance(answer(first), m.SeedOffer)
    second, challenge = connect(server)
    send_frame(second, hello(key, challenge, served))
    busy = answer(second)
    assert isinstance(busy, m.SeedBusy) and "--seed-max-clients" in busy.detail
    first.close()
    import time

    time.sleep(0.3)
    rightful_seed_works(server, key, served)
