"""`kubectl drain` of the node running the active engine and its standby, under a steady client.

The drain cordons the node and evicts its pods. The standby there goes at once (no budget
covers standbys); the active's eviction is refused (429) by the cache's PodDisruptionBudget,
and the drain retries it, while the operator, which reads the cordon as the active's failure
(`NodeCordoned`), says why in the status and starts a standby on the other node. Once that
standby is Ready it is promoted and the old active demoted; the drain's next retry evicts it.
No request fails after one retry, the drain completes, and the cache is Ready on the other node.
"""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from operator_e2e import by_role, wait_phase
from test_failover_e2e import Cache, pod
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import ApiError, Kube
from testcluster.sample import ENGINES, NAME, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def cordon(kube: Kube, node: str, on: bool) -> None:
    kube.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": on}})


def both_on_one_node(cache: Cache, kube: Kube) -> tuple[str, str, str]:
    """The active and its standby on one node (the drain then takes both): while the active's
    node is the only schedulable one, the standby is replaced there."""
    active, standby = cache.roles()
    node = cache.node_of(active)
    if cache.node_of(standby) != node:
        other = cache.node_of(standby)
        cordon(kube, other, True)
        try:
            kube.delete(f"/api/v1/namespaces/{cache.namespace}/pods/{standby}")
            active, standby = cache.roles(gone=standby)
        finally:
            cordon(kube, other, False)
    assert cache.node_of(active) == cache.node_of(standby) == node
    return active, standby, node


@pytest.mark.timeout(900)
def test_a_drain_of_the_active_engines_node_waits_for_a_standby_elsewhere_and_fails_no_request(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    ready_sample: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    proxy = service_proxy(namespace, NAME, 8000)
    proxy.wait_for_ready(1)
    cache = Cache(kube, kubelet, cluster, namespace, operator, proxy)
    active, standby, node = both_on_one_node(cache, kube)
    other = next(n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"] if n["metadata"]["name"] != node)

    # The budget covers what the Service serves, and the disruption controller has counted it.
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{NAME}-active"
    budget = wait_for(
        lambda: (
            (b := kube.get(path))["status"].get("observedGeneration") == b["metadata"]["generation"]
            and b["status"].get("currentHealthy") == 1
            and b
        ),
        30,
        describe=lambda: kube.get(path).get("status"),
    )
    assert budget["spec"]["minAvailable"] == 1 and budget["status"]["disruptionsAllowed"] == 0
    assert budget["spec"]["selector"]["matchLabels"]["weightcache.io/role"] == "active"
    assert budget["metadata"]["ownerReferences"][0]["kind"] == "WeightCache"
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": active, "namespace": namespace}}
    with pytest.raises(ApiError) as refused:
        kube.create(f"/api/v1/namespaces/{namespace}/pods/{active}/eviction", eviction)
    assert refused.value.status == 429, refused.value.body

    wc = f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/{NAME}"
    load = SteadyLoad(*proxy.address).start()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(1) as pool:
            drain = pool.submit(
                cluster.kubectl,
                "drain",
                node,
                "--ignore-daemonsets",
                "--delete-emptydir-data",
                "--timeout=540s",
                check=False,
                timeout=600,
            )
            # No standby off the node is Ready yet: the active stays, serving, and the status says why.
            blocked = wait_for(
                lambda: (
                    (s := kube.get(wc).get("status") or {}).get("phase") == "Degraded"
                    and "cordoned" in (s.get("message") or "")
                    and s
                ),
                60,
                interval=0.2,
                describe=lambda: kube.get(wc).get("status"),
            )
            assert "kubectl drain" in blocked["message"] and active in blocked["message"], blocked["message"]
            assert by_role(kube, namespace)["active"] == [active]
            result = drain.result(timeout=620)
            took = time.monotonic() - started
        assert result.returncode == 0, result.stdout + result.stderr
    finally:
        served = load.stop()
        cordon(kube, node, False)
    said = result.stdout + result.stderr
    assert "disruption budget" in said, said
    assert f"pod/{active} evicted" in said, said
    assert served.failed == [] and served.ok > 0, served
    refusals = said.count("disruption budget")
    print(f"drain: {took:.1f} s, {refusals} refused evictions; requests {served.ok} ok, {served.retried} retried")

    # Whole again on the other node: a standby started there took over, the old pods are gone.
    status = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        also=lambda s: len(s["engines"][0]["standbys"]) == 1 and s["engines"][0]["active"] not in (active, standby),
    )
    last = status["lastFailover"]
    assert (last["from"], last["fromNode"], last["toNode"], last["signal"]) == (
        active,
        node,
        other,
        "NodeCordoned",
    ), last
    now = status["engines"][0]
    assert cache.node_of(now["active"]) == cache.node_of(now["standbys"][0]) == other
    assert all(p["spec"].get("nodeName") == other for p in pods(kube, namespace, ENGINES)), "nothing new on the node"
    assert pod(kube, namespace, now["active"])["metadata"]["labels"]["weightcache.io/role"] == "active"
