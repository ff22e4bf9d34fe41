"""The replicas' hand-over lease (weightcache_operator.run.handover) on a real ClusterKopfPeering:
one holder at a time; the next one takes it only once the holder wants it no more and nothing is
inside; a holder that vanishes without releasing is replaced once its lease runs out."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import kubernetes
import pytest
from testcluster.controlplane import ControlPlane
from testcluster.waiting import wait_for
from weightcache_operator.kubeapi import KubeApi
from weightcache_operator.run.handover import ANNOTATION, HandOver

pytestmark = pytest.mark.e2e

PEERING_CRD = Path(__file__).resolve().parents[2] / "crds" / "kopf-peering.yaml"


@pytest.fixture
def peering(cluster: ControlPlane) -> Iterator[str]:
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", str(PEERING_CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=30s")
    name = f"handover-{uuid.uuid4().hex[:6]}"
    cluster.apply(f"apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata:\n  name: {name}\n")
    yield name
    cluster.kubectl("delete", "clusterkopfpeering", name, "--wait=false")


@pytest.fixture
def api(cluster: ControlPlane) -> KubeApi:
    configuration = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    return KubeApi(configuration)


def test_one_holder_at_a_time_released_only_when_idle_and_taken_over_after_expiry(api: KubeApi, peering: str) -> None:
    taken: list[str] = []
    first = HandOver(api, peering, "first", duration=3.0, on_taken=lambda: taken.append("first"))
    second = HandOver(api, peering, "second", duration=3.0, on_taken=lambda: taken.append("second"))
    try:
        first.want(True)
        wait_for(first.held, 10)
        assert first.enter()  # a pass is inside
        second.want(True)
        time.sleep(4)  # longer than the duration: renewals keep it
        assert not second.held() and not second.enter() and taken == ["first"]

        first.want(False)  # paused, but its pass still runs
        time.sleep(1.5)
        assert not second.held(), "released only when nothing is inside"
        first.leave()
        wait_for(second.held, 10)
        assert not first.held() and not first.enter()
        assert taken == ["first", "second"]
        holder = api.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{peering}")["metadata"]["annotations"][ANNOTATION]
        assert '"holder": "second"' in holder

        # The holder vanishes as a SIGKILLed process would: its keeper stops, nothing is released.
        second._stopped.set()
        vanished = time.monotonic()
        first.want(True)
        wait_for(first.held, 15)
        # Its last renewal was at most a third of the duration before: free no sooner than 2 s later.
        assert time.monotonic() - vanished >= 2.0 - 0.1, "taken before the lease ran out"
        wait_for(lambda: not second.held(), 5)  # unrenewed, its own view runs out too
    finally:
        first.stop()
        second.stop()
