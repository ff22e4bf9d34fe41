"""An engine-only change to a vLLM cache (spec.engine.vllm.engineArgs of
examples/weightcache-vllm-cpu.yaml) rolls the vLLM engines under a steady client: no request
fails, no daemon restarts, the daemons read no weight byte from disk (their own status) and
every new engine maps the arena (one more map served by the daemon each, no disk fallback in
its log)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from operator_e2e import is_ready, wait_phase
from test_rollout_e2e import apply, rollout
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.sample import VLLM_SAMPLE, daemon_facts, pods, sample
from testcluster.waiting import wait_for
from vllm_e2e import (  # noqa: F401 - fixtures
    DAEMONS,
    ENGINES,
    NAME,
    apply_example,
    engine_log,
    maps_served,
    read_from_disk,
    vllm_checkpoint,
)

pytestmark = pytest.mark.e2e

NEW_ENGINE_ARGS = ["--max-num-seqs", "8"]
"""A serving option: engines only, the weights' fingerprint unchanged."""


def test_vllm_engine_args_change_rolls_engines_without_failures_or_disk_reads(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    vllm_checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    apply_example(cluster, namespace)
    before_status = wait_phase(kube, namespace, operator, "Ready", timeout=480, name=NAME)
    before = daemon_facts(kube, namespace, DAEMONS)
    assert all(read > 0 for _, _, read in before.values()), f"each daemon loaded the checkpoint once: {before}"
    old_engines = {p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)}
    maps_before = maps_served(kube, namespace)
    proxy = service_proxy(namespace, NAME, 8000)
    proxy.wait_for_ready(1)

    body = sample(VLLM_SAMPLE)
    body["spec"]["engine"]["vllm"]["engineArgs"] = NEW_ENGINE_ARGS
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, body)

        def rolled() -> bool:
            engines = pods(kube, namespace, ENGINES)
            return (
                rollout(kube, namespace, NAME).get("phase") == "Complete"
                and len(engines) == 2
                and all(
                    is_ready(p) and " ".join(NEW_ENGINE_ARGS) in " ".join(p["spec"]["containers"][0]["command"])
                    for p in engines
                )
            )

        wait_for(rolled, 420, interval=0.5, describe=lambda: (rollout(kube, namespace, NAME), old_engines))
    finally:
        result = load.stop()
    print(f"load during the vLLM engine rollout: {result}")
    assert result.ok > 0 and result.failed == [], result
    assert all(change.ready for change in proxy.changes[1:]), [c.ready for c in proxy.changes]

    status = wait_phase(kube, namespace, operator, "Ready", name=NAME)
    assert (status["rollout"]["mode"], status["rollout"]["updated"]) == ("Engine", 1), status["rollout"]
    assert status["daemonSpecHash"] == before_status["daemonSpecHash"], "engine-only: no daemon generation change"
    assert daemon_facts(kube, namespace, DAEMONS) == before, "no daemon restarted or read the checkpoint again"
    engines = [p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)]
    assert not old_engines & set(engines), "every old engine retired"
    for name in engines:
        assert not read_from_disk(kubelet, namespace, name), engine_log(kubelet, namespace, name)[-4000:]
    assert maps_served(kube, namespace) == maps_before + len(engines), "each new engine mapped the arena"
