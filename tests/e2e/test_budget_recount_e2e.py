"""The disruption budget counts again after an active is demoted.

Kubernetes' disruption controller recounts a budget when a pod that matches it changes, judged by
the pod's new labels only: a pod relabelled out of the budget leaves the count as it was. Two
actives for a moment (a promotion before the demotion it pairs with, or a hand edit) then leave a
budget that counts two healthy actives and allows evicting the one that serves. The operator makes
it recount after each demotion (executor.py). Here a standby is relabelled active by hand; the
operator demotes one of the two, and the budget must come back to one healthy pod, allowing no
eviction.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from operator_e2e import by_role
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import Kube
from testcluster.sample import NAME
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e


def counted(kube: Kube, path: str, healthy: int) -> dict:
    return wait_for(
        lambda: (b := kube.get(path))["status"].get("currentHealthy") == healthy and b,
        30,
        describe=lambda: kube.get(path).get("status"),
    )


@pytest.mark.timeout(600)
def test_a_demoted_active_leaves_the_budget_counting_only_the_one_that_serves(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    ready_sample: dict,
) -> None:
    path = f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/{NAME}-active"
    counted(kube, path, 1)
    roles = wait_for(lambda: (r := by_role(kube, namespace))["standby"] and r, 60)
    [standby] = roles["standby"]

    edited = datetime.now(UTC)
    kube.patch(
        f"/api/v1/namespaces/{namespace}/pods/{standby}", {"metadata": {"labels": {"weightcache.io/role": "active"}}}
    )
    # The disruption controller counts the second active (it matches now), and the operator, on
    # that pod's event, keeps one active per replica and has the budget recounted.
    wait_for(lambda: len(by_role(kube, namespace)["active"]) == 1, 60, describe=lambda: by_role(kube, namespace))
    serving = by_role(kube, namespace)["active"]
    budget = wait_for(
        lambda: (b := kube.get(path))["status"].get("currentHealthy") == 1 and recounted(b, edited) and b,
        30,
        describe=lambda: kube.get(path),
    )
    assert budget["status"]["disruptionsAllowed"] == 0, budget["status"]
    assert recounted(budget, edited) == serving, budget["metadata"]["annotations"]


def recounted(budget: dict, since: datetime) -> list[str] | None:
    """The actives the operator's last recount named, if it came after ``since``."""
    value = (budget["metadata"].get("annotations") or {}).get("weightcache.io/serving-engines", "")
    found = re.fullmatch(r"(\S*) \((.+)\)", value)
    if not found or datetime.fromisoformat(found[2]) < since:
        return None
    return found[1].split(",")
