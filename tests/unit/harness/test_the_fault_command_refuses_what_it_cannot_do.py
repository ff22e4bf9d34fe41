"""`python -m testcluster fault` and the records it works from refuse, with a message naming the
fix, what they cannot do: no cluster running, a node the cluster does not have, a node that
shares the host's network, a fault that does not exist, a loss or rate out of range. Faults on a
running cluster's nodes are exercised in tests/e2e/test_nodes_have_networks_of_their_own_e2e.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from repo_root import ROOT
from testcluster.kubelet.nodenetwork import NodeNetwork, NodeNetworkError
from testcluster.local import LocalCluster, LocalClusterError


def fault(*words: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "testcluster", "fault", *words, "--dir", str(directory)],
        cwd=ROOT / "tests" / "cluster",
        capture_output=True,
        text=True,
        timeout=60,
    )


def cluster(networks: dict[str, str]) -> LocalCluster:
    return LocalCluster(
        "/d", 1, "s", "https://198.19.0.1:6443", "/k", "/kubectl", "/helm", ["node-1", "node-2"], networks
    )


def test_a_fault_needs_a_node_and_a_known_kind(tmp_path: Path) -> None:
    for words in ((), ("node-1",), ("node-1", "unplug"), ("node-1", "cut", "extra")):
        refused = fault(*words, directory=tmp_path)
        assert refused.returncode == 2, refused
        assert "fault: name the node and one of cut, cut-api, slow, heal, show" in refused.stderr


def test_a_fault_without_a_running_cluster_says_how_to_start_one(tmp_path: Path) -> None:
    refused = fault("node-1", "cut", directory=tmp_path)
    assert refused.returncode == 1
    assert f"no local cluster running from {tmp_path}: start one with make cluster" in refused.stderr


def test_a_node_the_cluster_lacks_or_one_on_the_host_s_network_has_no_faults() -> None:
    with pytest.raises(LocalClusterError, match="no node node-3 in this cluster; its nodes: node-1, node-2"):
        cluster({"node-1": "wc-node-7"}).network("node-3")
    with pytest.raises(
        LocalClusterError, match="node-2 shares the host's network .* need nodes with networks of their own"
    ):
        cluster({"node-1": "wc-node-7"}).network("node-2")
    network = cluster({"node-1": "wc-node-7", "node-2": "wc-node-8"}).network("node-2")
    assert (network.namespace, network.link, network.address) == ("wc-node-8", "wc-8", "198.18.8.1")
    assert cluster({}).api_port == 6443


def test_only_a_node_s_namespace_names_a_node_network() -> None:
    for name in ("wc-node-", "wc-node-x", "other-7", "wc-node-7;rm"):
        with pytest.raises(NodeNetworkError, match="is not a node's network namespace"):
            NodeNetwork.of_namespace(name)


def test_a_loss_or_rate_out_of_range_is_refused_before_anything_changes() -> None:
    # Octet 0 is never claimed: were a command run, it would fail on a missing namespace instead.
    network = NodeNetwork(0)
    for loss in (-0.1, 1.0, 2.0):
        with pytest.raises(NodeNetworkError, match="loss is the share of packets dropped"):
            network.shape(rate_kbit=1000, loss=loss)
    with pytest.raises(NodeNetworkError, match="the rate is in kbit/s, at least 8"):
        network.shape(rate_kbit=0)


def test_the_rate_and_loss_are_read_by_argparse_however_spelled(tmp_path: Path) -> None:
    # A unique prefix and the --opt=value form are argparse's, not ours: both reach --rate-kbit.
    for spelling in (["--rate", "fast"], ["--rate-kbit=fast"], ["--rate-k", "fast"]):
        refused = fault("node-1", "slow", *spelling, directory=tmp_path)
        assert refused.returncode == 2 and "argument --rate-kbit: invalid int value: 'fast'" in refused.stderr
    spelled = fault("node-1", "slow", "--rate=2000", "--loss=0.01", directory=tmp_path)
    assert spelled.returncode == 1 and "no local cluster running" in spelled.stderr
