"""The README sample Ready under the operator: its active engine deleted, then crashed, fails over
to the standby; the daemon-ready gate follows the node's daemon; scaling converges both ways; and
deleting the WeightCache removes every object and process it created."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from operator_e2e import PROMPT, by_role, gate, http_json, is_ready, wait_phase
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.kubelet.processes import CONTAINER_MARKER
from testcluster.rest import Kube
from testcluster.sample import DAEMONS, ENGINES, pods
from testcluster.strays import processes_with_environment
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_failover_gate_scaling_and_deletion(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    ready_sample: dict,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    before = by_role(kube, namespace)
    assert len(before["active"]) == 1 and len(before["standby"]) == 1

    # Deleting the active engine promotes the standby (its weights are mapped already) and a new
    # standby is created: the replica is whole again.
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{before['active'][0]}")
    wait_for(
        lambda: by_role(kube, namespace)["active"] == before["standby"], 30, describe=lambda: by_role(kube, namespace)
    )
    wait_for(lambda: len(by_role(kube, namespace)["standby"]) == 1, 30, describe=lambda: by_role(kube, namespace))
    status = wait_phase(
        kube, namespace, operator, "Ready", also=lambda s: s["engines"][0]["active"] != before["active"][0]
    )
    assert status["engines"][0]["active"] == before["standby"][0]
    assert len(status["engines"][0]["standbys"]) == 1 and status["engines"][0]["standbys"] != before["standby"]

    # The active engine's processes die (its container restarts in place): the Ready standby
    # takes the Service's traffic at once; the crashed pod is retired and a new standby made.
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    crashed, standby = status["engines"][0]["active"], status["engines"][0]["standbys"][0]
    standby_ip = kube.get(f"/api/v1/namespaces/{namespace}/pods/{standby}")["status"]["podIP"]
    worker = kubelet.pod_worker(namespace, crashed)
    assert worker is not None and worker.runners[0].process is not None
    os.killpg(worker.runners[0].process.pid, signal.SIGKILL)
    wait_for(lambda: by_role(kube, namespace)["active"] == [standby], 30, describe=lambda: by_role(kube, namespace))
    wait_for(lambda: proxy.ready_endpoints == (f"{standby_ip}:8000",), 30, describe=lambda: proxy.ready_endpoints)
    host, port = proxy.address
    assert http_json(f"http://{host}:{port}/v1/completions", PROMPT)["choices"][0]["text"]
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: s["engines"][0]["active"] == standby)
    assert len(status["engines"][0]["standbys"]) == 1 and crashed not in status["engines"][0]["standbys"]

    # The gate follows the node's daemon: it drops while that daemon is replaced, and returns.
    # (On the standby: an active on that node may be failed over and retired, see test_failover_e2e.)
    watched = next(
        p for p in pods(kube, namespace, ENGINES) if p["metadata"]["name"] == status["engines"][0]["standbys"][0]
    )
    node = watched["spec"]["nodeName"]
    daemon = next(p for p in pods(kube, namespace, DAEMONS) if p["spec"]["nodeName"] == node)
    kube.delete(f"/api/v1/namespaces/{namespace}/pods/{daemon['metadata']['name']}")
    get_watched = lambda: kube.get(f"/api/v1/namespaces/{namespace}/pods/{watched['metadata']['name']}")  # noqa: E731
    wait_for(
        lambda: gate(get_watched()) == "False" and not is_ready(get_watched()),
        20,
        describe=lambda: get_watched()["status"]["conditions"],
    )
    wait_for(
        lambda: gate(get_watched()) == "True" and is_ready(get_watched()),
        60,
        describe=lambda: get_watched()["status"]["conditions"],
    )
    wait_phase(kube, namespace, operator, "Ready")

    # Scaling converges both ways: two replicas without standbys, then one.
    cluster.kubectl(
        "patch",
        "wc",
        "tiny-llama",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"engine": {"replicas": 2, "standbysPerReplica": 0}}}',
    )
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: len(s["engines"]) == 2)
    assert (status["activeEngines"], status["standbyEngines"]) == (2, 0)
    assert [len(by_role(kube, namespace)[r]) for r in ("active", "standby")] == [2, 0]
    cluster.kubectl(
        "patch", "wc", "tiny-llama", "-n", namespace, "--type=merge", "-p", '{"spec": {"engine": {"replicas": 1}}}'
    )
    wait_for(lambda: len(by_role(kube, namespace)["active"]) == 1, 30, describe=lambda: by_role(kube, namespace))
    status = wait_phase(kube, namespace, operator, "Ready", also=lambda s: len(s["engines"]) == 1)
    assert (status["activeEngines"], status["standbyEngines"]) == (1, 0) and by_role(kube, namespace)["standby"] == []

    # Deleting the WeightCache removes every object and process it created.
    socket_dirs = [
        kubelet.node_root(n) / "run" / "weightcache" / f"{namespace}-tiny-llama" for n in ("node-1", "node-2")
    ]
    # One directory per daemon generation under the cache's.
    assert any(list(d.glob("*/tiny-llama/*.ready")) for d in socket_dirs), "the daemons wrote ready files"
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=90s")
    assert pods(kube, namespace, "weightcache.io/cache=tiny-llama") == []
    for kind in ("apis/apps/v1/namespaces/{ns}/daemonsets", "api/v1/namespaces/{ns}/services"):
        assert kube.get("/" + kind.format(ns=namespace))["items"] == []
    for worker in kubelet.pods_in(namespace):
        for runner in [*worker.init_runners, *worker.runners]:
            assert runner.process is None or runner.process.poll() is not None, (worker.name, runner.name)
            assert not processes_with_environment(CONTAINER_MARKER, runner.marker), (worker.name, runner.name)
    assert not any(list(d.glob("*/tiny-llama/*.ready")) for d in socket_dirs), "daemons removed their ready files"
