"""A vLLM-profile daemon on a "node" that never held the model copies a Ready peer's published
arena instead of running vLLM's loading and post-processing: the bytes and manifest equal the
peer's, no checkpoint byte beyond config and headers is read, and a vLLM engine that refuses any
fallback maps it with zero copies. With a credential that is not the cache's, the same start is
refused by the peer and vLLM loads from the disk, with the reason in the status."""

import mmap
import os
from pathlib import Path

from seeding_builders import free_port, peers_file, socket_status, write_credential
from vllm_harness import Daemon, Engine, assert_zero_copy, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.client.weights import DaemonConnection


def arena_bytes(daemon: Daemon) -> tuple[bytes, object]:
    """The rank's arena as the daemon maps it to engines, and its manifest."""
    with DaemonConnection(daemon.files(0).socket) as conn:
        config = conn.query_config()
        reply, fd = conn.fetch(config.fingerprint_digest)
    assert fd is not None
    try:
        with mmap.mmap(fd, reply.manifest.arena_bytes, prot=mmap.PROT_READ) as mapped:
            return bytes(mapped), reply.manifest
    finally:
        os.close(fd)


def test_a_vllm_rank_is_seeded_from_a_peer_and_served_without_vllms_load(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    key = write_credential(tmp_path / "credential")
    port = free_port()
    peer = start_daemon(
        model,
        tmp_path / "node-a",
        "qwen3",
        args,
        logs=tmp_path,
        keeper="off",
        seed_listen=f"127.0.0.1:{port}",
        seed_credential_file=key,
    )
    daemons = [peer]
    try:
        peer.wait_ready()
        peers = peers_file(tmp_path / "peers.json", port, {0: socket_status(peer.files(0).socket).weights_digest})

        foreign = start_daemon(
            model,
            tmp_path / "node-c",
            "qwen3",
            args,
            logs=tmp_path,
            keeper="off",
            seed_peers_file=peers,
            seed_credential_file=write_credential(tmp_path / "other-credential"),
            node_name="node-c",
        )
        daemons.append(foreign)
        foreign.wait_ready()
        refused = socket_status(foreign.files(0).socket)
        assert refused.seed is not None and refused.seed.peer is None, refused.seed
        assert "credential" in (refused.seed.fallback or ""), refused.seed.fallback
        assert refused.disk_bytes_read > 0  # vLLM loaded it
        foreign.stop()

        fresh = start_daemon(
            model,
            tmp_path / "node-b",
            "qwen3",
            args,
            logs=tmp_path,
            keeper="off",
            seed_peers_file=peers,
            seed_credential_file=key,
            node_name="node-b",
        )
        daemons.append(fresh)
        fresh.wait_ready()
        seeded = socket_status(fresh.files(0).socket)
        assert seeded.seed is not None and seeded.seed.peer == "node-a", seeded.seed
        assert seeded.seed.fallback is None and seeded.disk_bytes_read == 0
        assert "msg=published" in peer.log.read_text()  # the line vLLM's load and the publish end with
        log = fresh.log.read_text()
        assert 'msg="seeded from peer"' in log and "msg=published" not in log, log[-3000:]

        theirs, their_manifest = arena_bytes(peer)
        ours, our_manifest = arena_bytes(fresh)
        assert ours == theirs
        assert our_manifest.model_copy(update={"fingerprint_digest": ""}) == their_manifest.model_copy(
            update={"fingerprint_digest": ""}
        )

        with Engine(model, args, cache=cache_config(fresh), log=tmp_path / "engine.log") as engine:
            assert_zero_copy(engine.report(), tp=1)
            assert len(engine.generate()[0]) > 0
    finally:
        for daemon in daemons:
            daemon.stop()
