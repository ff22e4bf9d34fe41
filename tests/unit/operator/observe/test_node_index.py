"""node_index.NodeIndex: the nodes a pass reads come from the operator's node watch, not from a
LIST per pass, and keep only what passes read of each node."""

from __future__ import annotations

from functools import partial

from builders import engine, node
from weightcache_operator.observe.engine_nodes import EngineNodes
from weightcache_operator.observe.failures import unready_nodes
from weightcache_operator.observe.node_index import NodeIndex
from weightcache_operator.render.topology import selected
from weightcache_operator.spec import Placement

listed = partial(
    node,
    resource_version=7,
    taints=[{"key": "gpu", "value": "h200", "effect": "NoSchedule"}],
    unschedulable=True,
    ready=True,
    ready_since=0,
    status={
        "capacity": {"cpu": "8"},
        "images": [{"names": ["registry/engine:1"], "sizeBytes": 1 << 30}] * 50,
        "nodeInfo": {"kubeletVersion": "v1.35.4"},
    },
)
"""A tainted, cordoned, Ready node as the API lists it, with status fields no pass reads (images, nodeInfo)."""


def test_a_node_is_kept_with_what_placement_and_failover_read_and_without_its_images() -> None:
    index = NodeIndex()
    index.put(listed("n1", ready=False, labels={"zone": "a"}))
    (kept,) = index.nodes()
    assert kept["metadata"]["labels"] == {"zone": "a"} and kept["spec"]["unschedulable"] is True
    assert "images" not in kept["status"] and "nodeInfo" not in kept["status"]
    assert list(unready_nodes(index.nodes())) == ["n1"]
    tolerated = Placement.model_validate({"tolerations": [{"key": "gpu", "operator": "Exists"}]})
    assert selected(tolerated, kept) and not selected(Placement(), kept), "taints are kept for placement"


def test_the_latest_event_of_a_node_replaces_it_and_a_deleted_node_is_gone() -> None:
    index = NodeIndex()
    for name in ("n3", "n1", "n2"):
        index.put(listed(name))
    index.put(listed("n2", ready=False))
    assert [n["metadata"]["name"] for n in index.nodes()] == ["n1", "n2", "n3"], "in name order, whatever the events'"
    assert list(unready_nodes(index.nodes())) == ["n2"]
    index.remove("n2")
    index.remove("never-seen")
    assert [n["metadata"]["name"] for n in index.nodes()] == ["n1", "n3"] and len(index) == 2


def test_a_pass_holds_its_own_list_while_events_keep_arriving() -> None:
    index = NodeIndex()
    index.put(listed("n1"))
    seen = index.nodes()
    index.put(listed("n1", ready=False))
    index.put(listed("n2"))
    assert [n["status"]["conditions"][0]["status"] for n in seen] == ["True"], "a pass decides on one view"


def test_a_node_flip_finds_the_caches_whose_latest_pass_saw_an_engine_on_it_without_asking_the_api() -> None:
    placed = EngineNodes()
    placed.record(("ns", "a"), [engine("a-0", node="n1"), engine("a-1", node="n2"), engine("a-2", node=None)])
    placed.record(("ns", "b"), [engine("b-0", node="n2")])
    placed.record(("other", "c"), [engine("c-0", node="n2")])
    assert placed.caches_on("n2") == [("ns", "a"), ("ns", "b"), ("other", "c")]
    placed.record(("ns", "b"), [engine("b-1", node="n3")])
    assert placed.caches_on("n2") == [("ns", "a"), ("other", "c")], "the latest pass replaces what it saw"
    placed.forget(("ns", "a"))
    assert placed.caches_on("n1") == [] and placed.caches_on("n3") == [("ns", "b")]
