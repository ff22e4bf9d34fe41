"""The peers file's choice (``SeedPeers.candidates``): only peers holding the rank with the same
weights, never the daemon's own node, the operator's assignment first, then file order."""

from weightcache_contract.seeding import SeedPeer, SeedPeers


def peer(node: str, ranks: dict[int, str], **extra: object) -> SeedPeer:
    return SeedPeer(node=node, address=f"198.18.0.{len(node)}", ranks=ranks, **extra)


def test_only_peers_holding_the_rank_with_these_weights_are_candidates() -> None:
    peers = SeedPeers(
        peers=[peer("a", {0: "w0", 1: "w1"}), peer("b", {0: "other"}), peer("c", {1: "w1"}), peer("d", {0: "w0"})]
    )
    assert [p.node for p in peers.candidates(0, "w0", "new")] == ["a", "d"]
    assert [p.node for p in peers.candidates(1, "w1", "new")] == ["a", "c"]
    assert peers.candidates(2, "w2", "new") == []


def test_the_daemon_s_own_node_is_never_a_candidate() -> None:
    peers = SeedPeers(peers=[peer("self", {0: "w"}), peer("other", {0: "w"})])
    assert [p.node for p in peers.candidates(0, "w", "self")] == ["other"]


def test_the_assigned_peers_come_first_in_the_assignment_s_order() -> None:
    peers = SeedPeers(
        peers=[peer("a", {0: "w"}), peer("b", {0: "w"}), peer("c", {0: "w"})],
        assignments={"new": ["c", "gone", "b"]},
    )
    assert [p.node for p in peers.candidates(0, "w", "new")] == ["c", "b", "a"]
    assert [p.node for p in peers.candidates(0, "w", "unassigned")] == ["a", "b", "c"]


def test_local_rank_i_serves_on_the_base_port_plus_i() -> None:
    two = peer("a", {4: "w4", 5: "w5"}, port=9410)
    assert (two.rank_port(4), two.rank_port(5)) == (9410, 9411)
    explicit = peer("a", {4: "w4", 5: "w5"}, port=9410, local_index={4: 1, 5: 0})
    assert (explicit.rank_port(4), explicit.rank_port(5)) == (9411, 9410)
