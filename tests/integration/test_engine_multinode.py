"""An engine spanning two "nodes": two launchers (``--nnodes 2 --node-rank 0|1``), each running
only its node's rank and mapping it from its own node's daemon (a separate socket directory
holding only that rank), meeting at node 0's rendezvous over gloo. In float32 it must serve
exactly what a one-rank engine reading the checkpoint from disk serves (TP=2 differs from TP=1
only in the order partial sums are added; see test_engine_parallel.py).
"""

from __future__ import annotations

import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import EngineFactory, engines
from weightcache.engine.launcher import free_port, local_ranks
from weightcache_contract.errors import WeightCacheError

PROMPTS = ["The weight cache", "def add(a, b):"]


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[EngineFactory]:
    yield from engines(tmp_path)


def test_local_ranks_split_the_ranks_by_node() -> None:
    assert local_ranks(4, 2, 0) == [0, 1] and local_ranks(4, 2, 1) == [2, 3]
    assert local_ranks(2, 1, 0) == [0, 1]
    with pytest.raises(WeightCacheError, match="multiple of --nnodes"):
        local_ranks(3, 2, 0)
    with pytest.raises(WeightCacheError, match="--node-rank 2"):
        local_ranks(4, 2, 2)


@pytest.mark.slow
def test_tp2_over_two_nodes_serves_what_tp1_serves(llama, start_daemon, start_engine) -> None:
    with tempfile.TemporaryDirectory(prefix="wc-n0-") as node0, tempfile.TemporaryDirectory(prefix="wc-n1-") as node1:
        # Each "node" holds only its slot's rank, as the operator's per-slot daemons do.
        start_daemon(llama, tp_size=2, dtype="float32", ranks=[0], socket_dir_override=node0)
        start_daemon(llama, tp_size=2, dtype="float32", ranks=[1], socket_dir_override=node1)
        addr = f"127.0.0.1:{free_port()}"
        common = (
            "--tp-size",
            "2",
            "--nnodes",
            "2",
            "--dist-addr",
            addr,
            "--weight-cache-mode",
            "client",
            "--weight-cache-fallback",
            "error",
            "--name",
            "test",
            "--threads",
            "1",
            "--dtype",
            "float32",
        )
        follower = start_engine(llama, *common, "--node-rank", "1", "--socket-dir", node1, wait=False)
        leader = start_engine(llama, *common, "--node-rank", "0", "--socket-dir", node0, wait=False)
        leader.wait_ready(180)
        disk = start_engine(llama, "--weight-cache-mode", "off", "--dtype", "float32")

        ranks = leader.get("/health").body["ranks"]
        assert [(r["rank"], r["weights"]["mode"]) for r in ranks] == [(0, "cache"), (1, "cache")], ranks
        for prompt in PROMPTS:
            got = leader.complete(prompt, max_tokens=12)["choices"][0]
            want = disk.complete(prompt, max_tokens=12)["choices"][0]
            assert (got["token_ids"], got["text"]) == (want["token_ids"], want["text"])
        with pytest.raises(OSError):
            follower.get("/health")  # node 1 runs no HTTP server: rank 0 alone serves

        # Stopping the engine: node 0 drains and tells node 1's rank to stop; both exit 0.
        assert leader.stop(signal.SIGTERM) == 0
        assert follower.proc.wait(timeout=60) == 0, follower.output()
