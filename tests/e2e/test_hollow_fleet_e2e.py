"""The scale benchmark's hollow fleet (testcluster/kubelet/hollow.py) against the real API server:
a pod that another writer marks not ready, as the node lifecycle controller does on a node that
missed its Lease, is put back to what its hollow kubelet says, as a real kubelet's status manager
does. Without that, a loaded benchmark run left daemons Ready to their kubelet and not Ready to
everyone else for good."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testcluster.kubelet.hollow import HollowFleet
from testcluster.kubelet.nodes import NodeSpec
from testcluster.rest import Kube
from testcluster.waiting import wait_for
from weightcache_operator.objects import PodView

pytestmark = pytest.mark.e2e

TAINT = {"key": "weightcache.io/e2e-hollow", "value": "true", "effect": "NoSchedule"}


@pytest.fixture
def fleet(kube: Kube) -> Iterator[HollowFleet]:
    # Tainted, so no other test's DaemonSet places a pod here while it lives; removed after.
    specs = [NodeSpec(f"hollow-e2e-{i}", taints=[TAINT]) for i in range(2)]
    fleet = HollowFleet(kube, specs)
    fleet.start()
    try:
        yield fleet
    finally:
        fleet.stop()
        for spec in specs:
            kube.delete(f"/api/v1/nodes/{spec.name}")


def ready(pod: dict) -> str | None:  # type: ignore[type-arg]
    return PodView(pod).condition_status("Ready")


def test_a_pod_marked_not_ready_by_another_writer_is_put_right_by_its_hollow_kubelet(
    kube: Kube, namespace: str, fleet: HollowFleet
) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    kube.create(
        path,
        {
            "metadata": {"name": "sleeper"},
            "spec": {
                "nodeName": "hollow-e2e-0",
                "tolerations": [{**TAINT, "operator": "Equal"}],
                "containers": [{"name": "main", "image": "hollow"}],
            },
        },
    )
    pod = f"{path}/sleeper"
    wait_for(lambda: ready(kube.get(pod)) == "True", timeout=30, describe="the hollow pod Ready")

    # What the node lifecycle controller writes to the pods of a node whose Lease lapsed.
    live = kube.get(pod)
    conditions = [{**c, "status": "False"} if c["type"] == "Ready" else c for c in live["status"]["conditions"]]
    written = kube.patch(f"{pod}/status", {"status": {"conditions": conditions}})
    assert ready(written) == "False"

    wait_for(lambda: ready(kube.get(pod)) == "True", timeout=15, describe="the hollow kubelet's Ready back")
    assert fleet.pods_on("hollow-e2e-0") == [f"{namespace}/sleeper"]

    # Gone while its hollow kubelet still runs: no pod is left bound to a node the fixture removes.
    kube.delete(pod)
    wait_for(lambda: not fleet.pods_on("hollow-e2e-0"), timeout=15, describe="the hollow pod removed")
