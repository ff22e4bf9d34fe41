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
from network_e2e import ServiceWatch, cache_path, fault, gaps, gone, outside, wait_node
from operator_e2e import wait_phase
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
                last = wait_for(
                    lambda: (
                        (f := kube.get(cache_path(namespace))["status"].get("lastFailover") or {}).get("to") == standby
                        and f
                    ),
                    30,
                )
                promoted_at = time.time()
                # The old active keeps answering whoever reaches it for a while after the switch.
                time.sleep(5)
            finally:
                direct_result = direct.stop()
        healed_at = wait_node(kube, node, ready=True)
        wait_for(lambda: gone(kube, namespace, active), 120, describe=f"{active} was never retired")
        status = wait_phase(
            kube,
            namespace,
            operator,
            "Ready",
            also=lambda s: s["engines"][0]["active"] == standby and len(s["engines"][0]["standbys"]) == 1,
        )
        whole_at = time.time()
    finally:
        service_result = through_service.stop()
        samples = watch.stop()

    windows = gaps(proxy.changes[settled:])
    print(
        f"API cut -> Service on the standby: {switched.observed_at - cut_at:.1f} s; "
        f"Service without a ready endpoint: {[round(b - a, 3) for a, b in windows]} s; "
        f"healed -> cache whole: {whole_at - healed_at:.1f} s; "
        f"through the Service: {service_result}; straight to the old active while cut off: {direct_result}"
    )
    assert (last["from"], last["to"], last["signal"]) == (active, standby, "NodeNotReady"), last
    assert status["engines"][0]["standbys"][0] not in (active, standby)
    assert service_result.ok > 0 and outside(service_result.failed, windows) == [], (service_result.failed, windows)
    # One window at most: the one between Kubernetes' drop and the operator's promotion landing.
    assert len(windows) <= 1 and all(b - a < 5 for a, b in windows), windows
    assert direct_result.ok > 0 and direct_result.failed == [] and direct_result.retried == 0, direct_result
    # Once the failover is done, no other engine is ever active again, and the Service never offers
    # the old one, nor two at once, also after the node is back.
    assert watch.most_actives(since=promoted_at) == 1, [s for s in samples if len(s.actives) > 1][:3]
    after = proxy.changes[proxy.changes.index(switched) :]
    assert all(f"{old_ip}:8000" not in c.ready and len(c.ready) <= 1 for c in after), after
