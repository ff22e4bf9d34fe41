"""A starting daemon copies both ranks of a TP=2 layout from a Ready peer: no checkpoint byte read,
and an engine maps exactly the bytes a load from the disk gives."""

from __future__ import annotations

import torch
from seeding_builders import free_port, peers_file, status, weights_digests
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import expect, load_from_disk, load_weights


def test_a_tp2_rank_pair_is_seeded_from_a_peer_with_no_checkpoint_byte_read(
    llama, start_daemon, credential, tmp_path
) -> None:
    key = credential()
    port = free_port(2)
    peer = start_daemon(
        llama,
        name="seeded",
        ranks=[0, 1],
        tp_size=2,
        dtype="bfloat16",
        keeper="off",
        socket_dir_override=str(tmp_path / "node-a"),
        seed_listen=f"127.0.0.1:{port}",
        seed_credential_file=key,
    )
    assert all(status(peer, i).disk_bytes_read > 0 for i in range(2))
    peers = peers_file(tmp_path / "peers.json", port, weights_digests(peer))

    fresh = start_daemon(
        llama,
        name="seeded",
        ranks=[0, 1],
        tp_size=2,
        dtype="bfloat16",
        keeper="off",
        socket_dir_override=str(tmp_path / "node-b"),
        seed_peers_file=peers,
        seed_credential_file=key,
        node_name="node-b",
    )
    for i, rank in enumerate([0, 1]):
        st = status(fresh, i)
        assert st.disk_bytes_read == 0, fresh.output()
        assert st.seed is not None and st.seed.peer == "node-a" and st.seed.fallback is None, st.seed
        assert st.seed.bytes == st.arena_bytes or st.seed.bytes <= st.arena_bytes
        layout = Layout(tp_size=2, tp_rank=rank)
        mapped = load_weights(
            str(llama), layout, socket_dir=fresh.socket_dir, name="seeded", fallback="error", dtype="bfloat16"
        ).tensors
        disk = load_from_disk(expect(str(llama), layout, dtype="bfloat16")).tensors
        assert mapped.keys() == disk.keys()
        for name, tensor in disk.items():
            assert torch.equal(mapped[name], tensor), name
