"""Each rank in ``status.nodes`` says where its bytes came from (disk, keeper or peer) and, when it
asked peers, which one served it, how many bytes and how long it took; a rank that fell back to the
disk says so with no peer."""

from __future__ import annotations

from builders import NOW, daemon, make
from daemon_reports import rank, report
from weightcache_contract.seeding import SeedReport
from weightcache_operator.plan.status import Observed, aggregate
from weightcache_operator.render import daemon_spec_hash
from weightcache_operator.spec import WeightCacheStatus


def test_a_seeded_rank_names_its_peer_and_a_fallen_back_rank_its_disk() -> None:
    cache = make()
    pod = daemon("d", ready=True, spec_hash=daemon_spec_hash(cache))
    held = report(
        rank(0, source="peer", disk_bytes_read=0, seed=SeedReport(peer="node-a", bytes=4096, seconds=0.25)),
        rank(1, source="disk", seed=SeedReport(bytes=0, seconds=3.0, fallback="node-a: busy")),
    )

    status = aggregate(cache, Observed([pod], [], 1, daemon_reports={"d": held}), NOW).wire()

    ranks = status["nodes"][0]["ranks"]
    assert (ranks[0]["source"], ranks[0]["seedPeer"], ranks[0]["seedBytes"], ranks[0]["seedSeconds"]) == (
        "peer",
        "node-a",
        4096,
        0.25,
    )
    assert (ranks[1]["source"], ranks[1]["seedBytes"], ranks[1]["seedSeconds"]) == ("disk", 0, 3.0)
    assert "seedPeer" not in ranks[1]
    WeightCacheStatus.model_validate(status)


def test_a_rank_that_never_asked_peers_has_no_seed_fields() -> None:
    cache = make()
    pod = daemon("d", ready=True, spec_hash=daemon_spec_hash(cache))

    status = aggregate(cache, Observed([pod], [], 1, daemon_reports={"d": report(rank(0), rank(1))}), NOW).wire()

    assert not [k for r in status["nodes"][0]["ranks"] for k in r if k.startswith("seed")]
