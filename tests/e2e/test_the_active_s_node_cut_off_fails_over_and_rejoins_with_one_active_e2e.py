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
from network_e2e import ServiceWatch, cache_path, fault, gaps, gone, wait_node
from operator_e2e import wait_phase
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
            last = wait_for(
                lambda: (
                    (f := kube.get(cache_path(namespace))["status"].get("lastFailover") or {}).get("to") == standby
                    and f
                ),
                30,
            )
            promoted_at = time.time()
            # While the node is away its engine still runs there, but it is the Service's no longer.
            worker = kubelet.pod_worker(namespace, active)
            assert worker is not None and worker.runners[0].process is not None
            assert worker.runners[0].process.poll() is None, "the cut node's engine runs on"
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
        result = load.stop()
        samples = watch.stop()

    print(
        f"cut -> Service on the standby: {switched.observed_at - cut_at:.1f} s; "
        f"Service without a ready endpoint: {[round(b - a, 3) for a, b in gaps(proxy.changes[settled:])]} s; "
        f"healed -> cache whole: {whole_at - healed_at:.1f} s; load: {result}"
    )
    assert (last["from"], last["to"], last["signal"]) == (active, standby, "NodeNotReady"), last
    assert status["engines"][0]["standbys"][0] not in (active, standby)
    assert result.ok > 0 and result.failed == [], result.failed
    # Never two actives, never two endpoints; once switched, the old active never came back.
    # Once the failover is done, no other engine is ever active again, and the Service never offers
    # the old one, nor two at once, also after the node is back.
    assert watch.most_actives(since=promoted_at) == 1, [s for s in samples if len(s.actives) > 1][:3]
    after = proxy.changes[proxy.changes.index(switched) :]
    assert all(old_ip not in c.ready and len(c.ready) <= 1 for c in after), after
