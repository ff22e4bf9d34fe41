"""The active engine's node is cut off from everything (its network drops every packet but its
own loopback) while a client sends requests through the Service, retrying once: the node turns
NotReady, the operator promotes the standby on the other node, and the Service switches to it
(the time from the cut to that switch is printed). When the link heals, the old active is
retired, not resumed: at no moment are two engines active or two endpoints behind the Service,
and the cache returns to its declared shape, one active and one standby Ready."""

from __future__ import annotations

import subprocess
import time

import pytest
from network_e2e import ServiceWatch, assert_one_active_after, failover_to, fault, gaps, rejoined, wait_node
from test_failover_e2e import Cache, pod
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_the_active_s_node_cut_off_fails_over_and_rejoins_with_one_active(
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
    old_ip, new_ip = (f"{pod(kube, namespace, name)['status']['podIP']}:8000" for name in (active, standby))
    wait_for(lambda: proxy.ready_endpoints == (old_ip,), 30, describe=lambda: proxy.ready_endpoints)
    settled = len(proxy.changes)

    watch = ServiceWatch(kube, namespace, proxy).start()
    load = SteadyLoad(*proxy.address).start()
    try:
        with fault(kubelet, node, "cut") as cut_at:
            wait_for(lambda: proxy.ready_endpoints == (new_ip,), 90, describe=lambda: proxy.changes[settled:])
            switched = next(c for c in proxy.changes[settled:] if c.ready == (new_ip,))
            wait_node(kube, node, ready=False, timeout=5)
            last = failover_to(kube, namespace, standby)
            promoted_at = time.time()
            # While the node is away its engine still runs there, but it is the Service's no longer.
            worker = kubelet.pod_worker(namespace, active)
            assert worker is not None and worker.runners[0].process is not None
            assert worker.runners[0].process.poll() is None, "the cut node's engine runs on"
        status, whole_s = rejoined(kube, namespace, operator, node, active, standby)
    finally:
        result = load.stop()
        watch.stop()

    print(
        f"cut -> Service on the standby: {switched.observed_at - cut_at:.1f} s; "
        f"Service without a ready endpoint: {[round(b - a, 3) for a, b in gaps(proxy.changes[settled:])]} s; "
        f"healed -> cache whole: {whole_s:.1f} s; load: {result}"
    )
    assert (last["from"], last["to"], last["signal"]) == (active, standby, "NodeNotReady"), last
    assert status["engines"][0]["standbys"][0] not in (active, standby)
    assert result.ok > 0 and result.failed == [], result.failed
    assert_one_active_after(watch, proxy.changes, switched, old_ip, promoted_at)
