"""Builders for seeding scenarios (tests/integration/seeding, tests/vllm_engine): two "nodes" are
two socket directories on this machine, each with its own daemon; the starting one is told about
the Ready one through a real peers file and both hold a real credential file. The peer serves on
loopback TCP."""

from __future__ import annotations

import mmap
import os
import socket
from pathlib import Path
from typing import Any

from weightcache.arenas.arena import CpuShmArena
from weightcache.client.weights import DaemonConnection
from weightcache.daemon.serving import Served
from weightcache.wire.protocol import StatusReply
from weightcache_contract.seeding import SeedPeer, SeedPeers


def free_port(count: int = 1) -> int:
    """A port with ``count`` free ports from it (local rank i serves on port + i)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        try:
            held = []
            for i in range(count):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                held.append(s)
            for s in held:
                s.close()
            return base
        except OSError:
            for s in held:
                s.close()
    raise AssertionError("no free port run")


def write_credential(path: Path, key: bytes | None = None) -> str:
    """A credential file as the kubelet mounts the Secret's key (random 32 bytes unless ``key``)."""
    path.write_bytes(key if key is not None else os.urandom(32))
    path.chmod(0o600)
    return str(path)


def peers_file(path: Path, port: int, ranks: dict[int, str], node: str = "node-a") -> str:
    path.write_text(
        SeedPeers(peers=[SeedPeer(node=node, address="127.0.0.1", port=port, ranks=ranks)]).model_dump_json()
    )
    return str(path)


def status(daemon: Any, index: int = 0) -> StatusReply:
    return socket_status(daemon.files[index].socket)


def socket_status(path: Path) -> StatusReply:
    """The status a rank's daemon answers on its socket."""
    with DaemonConnection(path) as conn:
        return conn.status()


def weights_digests(daemon: Any) -> dict[int, str]:
    return {rank: status(daemon, i).weights_digest for i, rank in enumerate(daemon.ranks)}


def served_copy(daemon: Any, name: str) -> Served:
    """What a real daemon's rank 0 serves, copied into an arena of this process: its bytes, its
    fingerprint and manifest. A seed server of the test's own can serve it (or lie about it)."""
    with DaemonConnection(daemon.files[0].socket) as conn:
        config = conn.query_config()
        reply, fd = conn.fetch(config.fingerprint_digest)
    assert fd is not None
    arena = CpuShmArena(reply.manifest.arena_bytes, name)
    with mmap.mmap(fd, reply.manifest.arena_bytes, prot=mmap.PROT_READ) as original:
        arena.buffer().numpy()[:] = memoryview(original)
    os.close(fd)
    return Served(name, 0, arena, reply.manifest, config.fingerprint, 0.0, 0)
