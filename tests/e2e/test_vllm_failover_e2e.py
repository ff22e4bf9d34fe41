"""A vLLM cache (examples/weightcache-vllm-cpu.yaml as written) whose active engine is SIGKILLed:
its standby, which maps the same arena, is promoted exactly once, a replacement standby is made,
and the Service answers on with the same greedy tokens."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
from operator_e2e import wait_phase
from test_failover_e2e import Cache, engine_pgid
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from vllm_e2e import NAME, apply_example, read_from_disk, served_token_ids, vllm_checkpoint  # noqa: F401 - fixtures

pytestmark = pytest.mark.e2e


def test_vllm_active_engine_killed_promotes_its_standby_and_answers_go_on(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    vllm_checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    apply_example(cluster, namespace)
    wait_phase(kube, namespace, operator, "Ready", timeout=480, name=NAME)
    cache = Cache(kube, kubelet, cluster, namespace, operator, service_proxy(namespace, NAME, 8000), name=NAME)
    cache.proxy.wait_for_ready(1)
    answer = served_token_ids(cache.proxy)

    last = cache.fails_over(
        "ContainerRestarted", lambda active, _: os.killpg(engine_pgid(kubelet, namespace, active), signal.SIGKILL)
    )
    assert served_token_ids(cache.proxy) == answer
    active, standby = cache.roles()
    assert active == last["to"]
    assert not read_from_disk(kubelet, namespace, standby), "the replacement standby maps the arena too"
