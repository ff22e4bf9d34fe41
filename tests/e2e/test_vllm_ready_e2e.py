"""examples/weightcache-vllm-cpu.yaml applied as written on the real control plane: its daemons
(profile vllm) and its vLLM engines (``vllm serve --load-format weightcache``) become Ready (each
only once it has served its warm sidecar's request), the
engines map the daemon's arena (the daemon served one map per engine, no engine fell back to disk), and a greedy completion through the Service, asked for by the
cache's name, equals vLLM's own from disk on the same checkpoint."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from operator_e2e import http_json, http_text, is_ready, total, wait_phase, warm_status
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import pods
from vllm_e2e import (  # noqa: F401 - fixtures
    DAEMONS,
    ENGINES,
    NAME,
    apply_example,
    disk_token_ids,
    engine_log,
    maps_served,
    read_from_disk,
    served_token_ids,
    vllm_checkpoint,
)

pytestmark = pytest.mark.e2e


def test_vllm_example_becomes_ready_maps_the_cache_and_answers_as_vllm_from_disk(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    vllm_checkpoint: Path,
    disk_token_ids: list[int],
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    apply_example(cluster, namespace)
    status = wait_phase(kube, namespace, operator, "Ready", timeout=480, name=NAME)
    assert (status["activeEngines"], status["standbyEngines"]) == (1, 1), status

    for daemon in pods(kube, namespace, DAEMONS):
        command = next(c for c in daemon["spec"]["containers"] if c["name"] == "daemon")["command"]
        assert command[command.index("--profile") + 1] == "vllm", command
        assert is_ready(daemon)
    engines = pods(kube, namespace, ENGINES)
    assert sorted(p["metadata"]["labels"]["weightcache.io/role"] for p in engines) == ["active", "standby"]
    for engine in engines:
        command = engine["spec"]["containers"][0]["command"]
        assert command[:2] == ["vllm", "serve"], command
        assert command[command.index("--load-format") + 1] == "weightcache", command
        assert is_ready(engine)
        name = engine["metadata"]["name"]
        assert not read_from_disk(kubelet, namespace, name), engine_log(kubelet, namespace, name)[-4000:]
        # Hot means it has served: before any client asked, vLLM itself counts a finished request
        # in each Ready engine (the standby too), its warm sidecar's.
        assert warm_status(engine)["warmed"] >= 1, warm_status(engine)
        page = http_text(f"http://{engine['status']['podIP']}:8000/metrics")
        assert total(page, "vllm:request_success_total") >= 1, page
    assert maps_served(kube, namespace) == len(engines), "each engine mapped the daemon's arena once"

    proxy = service_proxy(namespace, NAME, 8000)
    proxy.wait_for_ready(1)
    assert served_token_ids(proxy) == disk_token_ids
    # Served under the cache's name, not the pod's mount path: what status (and kubectl get wc) shows.
    assert status["servedModelName"] == NAME
    host, port = proxy.address
    assert [m["id"] for m in http_json(f"http://{host}:{port}/v1/models")["data"]] == [NAME]
