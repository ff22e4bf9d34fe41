"""The active engine's node loses the API server only: its kubelet goes silent, but its engines
still run and everyone else still reaches them. Kubernetes cannot tell that from a dead node:
after the grace period the node is NotReady, the node controller marks its pods not Ready and
the Service drops the active. The operator promotes the standby on the other node. A client
talking to the old active directly loses no request while the node is cut off; a client of the
Service (retrying at once) loses requests only in the moment between Kubernetes dropping the old
active and the promoted standby's endpoint arriving, which is measured and printed. When the API
server is back, the old active is retired, never a second active, and the cache returns to one
active and one standby Ready."""

from __future__ import annotations

import subprocess
import time

import pytest
from network_e2e import ServiceWatch, assert_one_active_after, failover_to, fault, gaps, outside, rejoined, wait_node
from test_failover_e2e import Cache, pod
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_a_node_cut_off_from_the_api_server_serves_its_clients_while_the_cache_fails_over(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    ready_sample: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    cache = Cache(kube, kubelet, cluster, namespace, operator, proxy)
    active, standby = cache.standby_elsewhere()
    node = cache.node_of(active)
    old_ip, new_ip = (pod(kube, namespace, name)["status"]["podIP"] for name in (active, standby))
    wait_for(lambda: proxy.ready_endpoints == (f"{old_ip}:8000",), 30, describe=lambda: proxy.ready_endpoints)
    settled = len(proxy.changes)

    watch = ServiceWatch(kube, namespace, proxy).start()
    through_service = SteadyLoad(*proxy.address).start()
    try:
        with fault(kubelet, node, "cut-api") as cut_at:
            direct = SteadyLoad(old_ip, 8000).start()
            try:
                wait_node(kube, node, ready=False, timeout=30)
                wait_for(
                    lambda: proxy.ready_endpoints == (f"{new_ip}:8000",), 90, describe=lambda: proxy.changes[settled:]
                )
                switched = next(c for c in proxy.changes[settled:] if c.ready == (f"{new_ip}:8000",))
                last = failover_to(kube, namespace, standby)
                promoted_at = time.time()
                # The old active keeps answering whoever reaches it for a while after the switch.
                time.sleep(5)
            finally:
                direct_result = direct.stop()
        status, whole_s = rejoined(kube, namespace, operator, node, active, standby)
    finally:
        service_result = through_service.stop()
        watch.stop()

    windows = gaps(proxy.changes[settled:])
    print(
        f"API cut -> Service on the standby: {switched.observed_at - cut_at:.1f} s; "
        f"Service without a ready endpoint: {[round(b - a, 3) for a, b in windows]} s; "
        f"healed -> cache whole: {whole_s:.1f} s; "
        f"through the Service: {service_result}; straight to the old active while cut off: {direct_result}"
    )
    assert (last["from"], last["to"], last["signal"]) == (active, standby, "NodeNotReady"), last
    assert status["engines"][0]["standbys"][0] not in (active, standby)
    assert service_result.ok > 0 and outside(service_result.failed, windows) == [], (service_result.failed, windows)
    # One window at most: the one between Kubernetes' drop and the operator's promotion landing.
    assert len(windows) <= 1 and all(b - a < 5 for a, b in windows), windows
    assert direct_result.ok > 0 and direct_result.failed == [] and direct_result.retried == 0, direct_result
    assert_one_active_after(watch, proxy.changes, switched, f"{old_ip}:8000", promoted_at)
