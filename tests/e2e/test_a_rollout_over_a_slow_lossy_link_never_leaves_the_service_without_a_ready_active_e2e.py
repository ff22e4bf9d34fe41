"""An engine rollout while the active's node sits behind a slow, lossy link (1 Mbit/s each way,
2% of packets dropped each way): that node's kubelet, its pods' status, the operator's probes and
the clients' requests all cross it. The rollout completes, or stalls with its reason in the
status; either way the Service always has a ready active, and a client sending through it and
retrying once loses no request."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from network_e2e import ServiceWatch, fault
from operator_e2e import is_ready, sample, wait_phase
from test_failover_e2e import Cache, pod
from test_rollout_e2e import apply, env_of, rollout, with_engine_env
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.sample import ENGINES, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

RATE_KBIT, LOSS = 1000, 0.02


def test_a_rollout_over_a_slow_lossy_link_never_leaves_the_service_without_a_ready_active(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    body = sample()
    apply(cluster, namespace, body)
    wait_phase(kube, namespace, operator, "Ready")
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    cache = Cache(kube, kubelet, cluster, namespace, operator, proxy)
    active, _ = cache.standby_elsewhere()
    node = cache.node_of(active)
    active_ip = pod(kube, namespace, active)["status"]["podIP"]
    wait_for(lambda: proxy.ready_endpoints == (f"{active_ip}:8000",), 30, describe=lambda: proxy.ready_endpoints)
    settled = len(proxy.changes)

    def outcome() -> str | None:
        engines = pods(kube, namespace, ENGINES)
        state = rollout(kube, namespace)
        if state.get("phase") == "Stalled":
            return f"stalled: {state.get('message')}"
        if (
            state.get("phase") == "Complete"
            and len(engines) == 2
            and all(env_of(p).get("ENGINE_VERSION") == "2" and is_ready(p) for p in engines)
        ):
            return "complete"
        return None

    watch = ServiceWatch(kube, namespace, proxy).start()
    load = SteadyLoad(*proxy.address, timeout_s=60).start()
    try:
        with fault(kubelet, node, "slow", rate_kbit=RATE_KBIT, loss=LOSS):
            started = time.time()
            apply(cluster, namespace, with_engine_env(body, "ENGINE_VERSION", "2"))
            ended = wait_for(
                outcome,
                420,
                interval=0.5,
                describe=lambda: (
                    rollout(kube, namespace),
                    [
                        (p["metadata"]["name"], p["spec"].get("nodeName"), is_ready(p))
                        for p in pods(kube, namespace, ENGINES)
                    ],
                ),
            )
            took = time.time() - started
    finally:
        result = load.stop()
        samples = watch.stop()

    print(f"rollout over a {RATE_KBIT} kbit/s link losing {LOSS:.0%} each way: {ended} in {took:.1f} s; load: {result}")
    assert ended == "complete" or ended.startswith("stalled: ") and len(ended) > len("stalled: ") + 10, ended
    assert result.ok > 0 and result.failed == [], result.failed
    # The Service always had a ready active, sampled and as its proxy saw every change.
    assert watch.without_endpoint() == [], watch.without_endpoint()[:3]
    assert all(change.ready for change in proxy.changes[settled:]), proxy.changes[settled:]
    assert len(samples) > 10
    if ended == "complete":
        status = wait_phase(kube, namespace, operator, "Ready")
        assert status["rollout"]["updated"] == status["rollout"]["total"] == 1, status["rollout"]
