"""An engine rollout with ``spec.engine.rollout.maxSurge: 2`` on the real control plane, with the
process kubelet and the operator as a process: both replicas' new-version engines start side by
side, the Service never has fewer Ready actives than ``replicas``, no request fails, no daemon
restarts or reads a weight byte from disk, and the rollout completes."""

from __future__ import annotations

import subprocess
import threading
from collections import Counter
from pathlib import Path

import pytest
from operator_e2e import is_ready, sample, wait_phase
from test_rollout_e2e import apply, daemon_facts, env_of, live_engine_names, reported, rollout, with_engine_env
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.load import SteadyLoad
from testcluster.rest import Kube
from testcluster.sample import ENGINES, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

REPLICAS = 2


def surges_in_flight(engines: list[dict]) -> set[str]:
    """Replicas that have a new-version engine (``ENGINE_VERSION`` 2) while their active is still
    an old one: surges not yet promoted."""
    old_active = {
        p["metadata"]["labels"]["weightcache.io/replica"]
        for p in engines
        if p["metadata"]["labels"]["weightcache.io/role"] == "active"
        and env_of(p).get("ENGINE_VERSION") != "2"
        and not p["metadata"].get("deletionTimestamp")
    }
    return {
        p["metadata"]["labels"]["weightcache.io/replica"]
        for p in engines
        if env_of(p).get("ENGINE_VERSION") == "2" and p["metadata"]["labels"]["weightcache.io/replica"] in old_active
    }


def test_max_surge_two_rolls_both_replicas_side_by_side_without_losing_a_ready_active(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    body = sample(engine__replicas=REPLICAS, engine__rollout={"maxSurge": 2})
    apply(cluster, namespace, body)
    before_status = wait_phase(kube, namespace, operator, "Ready", also=reported)
    before = daemon_facts(kube, namespace)
    old_engines = live_engine_names(kube, namespace)
    assert len(old_engines) == 2 * REPLICAS, "an active and a standby per replica"
    proxy = service_proxy(namespace, "tiny-llama", 8000)
    proxy.wait_for_ready(REPLICAS, timeout=60)
    settled = len(proxy.changes)

    # Sampled while the rollout runs: which replicas had a surge at the same moment.
    together: list[set[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            together.append(surges_in_flight(pods(kube, namespace, ENGINES)))
            stop.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    load = SteadyLoad(*proxy.address).start()
    try:
        apply(cluster, namespace, with_engine_env(body, "ENGINE_VERSION", "2"))

        def rolled() -> bool:
            engines = pods(kube, namespace, ENGINES)
            return (
                rollout(kube, namespace).get("phase") == "Complete"
                and len(engines) == 2 * REPLICAS
                and all(env_of(p).get("ENGINE_VERSION") == "2" and is_ready(p) for p in engines)
            )

        wait_for(
            rolled,
            300,
            interval=0.5,
            describe=lambda: (
                rollout(kube, namespace),
                [
                    (p["metadata"]["name"], env_of(p).get("ENGINE_VERSION"), is_ready(p))
                    for p in pods(kube, namespace, ENGINES)
                ],
            ),
        )
    finally:
        result = load.stop()
        stop.set()
        watcher.join()
    print(f"load during the rollout: {result}")
    most = max(together, key=len)
    print(f"surges in flight at once, at most: {sorted(most)} ({len(together)} samples)")
    assert most == {"0", "1"}, "maxSurge 2: both replicas' new engines start side by side"
    assert result.ok > 0 and result.failed == [], result.failed
    # Old and new actives overlap behind the Service; it never has fewer than one per replica.
    counts = [len(change.ready) for change in proxy.changes[settled:]]
    assert counts and min(counts) >= REPLICAS, counts
    engines = pods(kube, namespace, ENGINES)
    assert not old_engines & {p["metadata"]["name"] for p in engines}, "every old engine retired"
    roles = Counter(p["metadata"]["labels"]["weightcache.io/role"] for p in engines)
    assert roles == {"active": REPLICAS, "standby": REPLICAS}, roles
    status = wait_phase(kube, namespace, operator, "Ready")
    done = status["rollout"]
    assert (done["mode"], done["updated"], done["total"], done["currentStep"]) == (
        "Engine",
        REPLICAS,
        REPLICAS,
        "every replica updated",
    )
    # Both versions map the same arenas: no daemon restarted or read the checkpoint again.
    assert daemon_facts(kube, namespace) == before
    disk = [r["diskBytesRead"] for n in status["nodes"] for r in n["ranks"]]
    assert disk == [r["diskBytesRead"] for n in before_status["nodes"] for r in n["ranks"]]
