"""spec.routing.inferencePool on the real control plane with the upstream InferencePool CRD
(tests/e2e/upstream/, v1.6.0), the process kubelet and the operator as a process. One cache goes
through every step (an engine start costs most of the time here): asked for a managed pool
without the rights, then without the CRD, each said in InferencePoolReady; then the pool, whose
selector the API server answers with exactly the serving engines — before and after a failover,
an engine rollout and a daemon generation change (which moves its hash label with the Service's); switched to a referenced pool, which is checked (missing, too wide, fixed)
and never touched while the managed one is deleted; and finally the cache deleted, which takes a
managed pool with it and leaves a referenced one alone."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from operator_e2e import by_role, sample, wait_phase
from test_rollout_e2e import replaced, reported, rollout, with_engine_env
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import ApiError, Kube
from testcluster.sample import ENGINES, NAME, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
POOL_CRD = REPO / "tests" / "e2e" / "upstream" / "inference.networking.k8s.io_inferencepools.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
MANAGED = {"inferencePool": {"mode": "Managed", "endpointPickerRef": {"name": "epp", "port": 9002}}}


def pools_path(namespace: str) -> str:
    return f"/apis/inference.networking.k8s.io/v1/namespaces/{namespace}/inferencepools"


def condition(status: dict, kind: str = "InferencePoolReady") -> dict:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def said(reason: str, ok: bool = False):  # type: ignore[no-untyped-def]
    """A status whose InferencePoolReady has ``reason`` (and status ``ok``)."""
    return lambda s: condition(s).get("reason") == reason and condition(s).get("status") == str(ok)


def selected(kube: Kube, namespace: str, match_labels: dict[str, str]) -> list[str]:
    """The pods the API server selects with ``match_labels``, not being deleted, by name."""
    found = pods(kube, namespace, ",".join(f"{k}={v}" for k, v in sorted(match_labels.items())))
    return sorted(p["metadata"]["name"] for p in found if not p["metadata"].get("deletionTimestamp"))


def pool_selects_the_serving_engines(kube: Kube, namespace: str) -> bool:
    """The managed pool's selector is the Service's, and selects exactly the serving engines."""
    pool = kube.get(f"{pools_path(namespace)}/{NAME}")
    service = kube.get(f"/api/v1/namespaces/{namespace}/services/{NAME}")
    match = pool["spec"]["selector"]["matchLabels"]
    serving = by_role(kube, namespace)["active"]
    return match == service["spec"]["selector"] and len(serving) == 1 and selected(kube, namespace, match) == serving


def with_routing(routing: dict, version: str = "1", revision: str = "seed-0") -> dict:
    """The sample with ``routing``, engine version ``version`` (an env var: changing it is an
    engine rollout) and model revision ``revision`` (changing it is a daemon generation change)."""
    body = sample(model__revision=revision)
    body["spec"]["routing"] = routing
    return with_engine_env(body, "ENGINE_VERSION", version)


def apply(cluster: ControlPlane, namespace: str, body: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))


def test_pool_follows_the_serving_engines_and_a_referenced_pool_is_checked_never_touched(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    operator: subprocess.Popen,
    checkpoint: Path,
) -> None:
    # Asked for with the shipped ClusterRole (routing.inferencePool.enabled false) and no CRD: the
    # cache serves through its Service; the condition says what to enable (the API server answers
    # 403 before it looks for the resource).
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--wait=true", timeout=90)
    apply(cluster, namespace, with_routing(MANAGED))
    status = wait_phase(kube, namespace, operator, "Ready", also=said("Forbidden"))
    assert status["inferencePool"] == {"name": NAME, "mode": "Managed"}
    assert "--set routing.inferencePool.enabled=true" in condition(status)["message"]

    # The chart's rule for routing.inferencePool.enabled=true, added to the operator's ClusterRole:
    # now the missing CRD is what the condition names.
    chart = cluster.helm("template", "weightcache", str(REPO / "charts" / "weightcache"), "--set",
                         "routing.inferencePool.enabled=true").stdout  # fmt: skip
    role = next(d for d in yaml.safe_load_all(chart) if d and d["kind"] == "ClusterRole")
    rule = next(r for r in role["rules"] if "inferencepools" in r["resources"])
    path = f"/apis/rbac.authorization.k8s.io/v1/clusterroles/weightcache-operator-{namespace}"
    kube.patch(path, {"rules": [*kube.get(path)["rules"], rule]}, content_type="application/merge-patch+json")
    status = wait_phase(kube, namespace, operator, "Ready", also=said("CRDNotInstalled"))
    assert "tested with release v1.6.0" in condition(status)["message"]

    # The upstream CRD installed: the pool is created.
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", str(POOL_CRD))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=30s")
    wait_phase(kube, namespace, operator, "Ready", also=said("PoolApplied", ok=True))
    pool = kube.get(f"{pools_path(namespace)}/{NAME}")
    assert pool["spec"]["targetPorts"] == [{"number": 8000}]
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }
    assert pool["metadata"]["annotations"]["weightcache.io/served-model-name"] == NAME
    owner = pool["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("WeightCache", NAME, True)
    assert pool_selects_the_serving_engines(kube, namespace)
    assert len(by_role(kube, namespace)["standby"]) == 1, "a Ready standby the pool leaves out"

    # Failover: the active engine's processes die; the pool then selects the promoted standby only.
    active, standby = by_role(kube, namespace)["active"][0], by_role(kube, namespace)["standby"][0]
    worker = kubelet.pod_worker(namespace, active)
    assert worker is not None and worker.runners[0].process is not None
    os.killpg(worker.runners[0].process.pid, signal.SIGKILL)
    wait_for(lambda: by_role(kube, namespace)["active"] == [standby], 60, describe=lambda: by_role(kube, namespace))
    wait_for(
        lambda: pool_selects_the_serving_engines(kube, namespace),
        30,
        describe=lambda: (kube.get(f"{pools_path(namespace)}/{NAME}")["spec"], by_role(kube, namespace)),
    )
    wait_phase(kube, namespace, operator, "Ready", also=lambda s: len(s["engines"][0]["standbys"]) == 1)

    # An engine rollout: new engines take over, the pool selects the new active only.
    old = {p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)}
    apply(cluster, namespace, with_routing(MANAGED, version="2"))
    before = wait_phase(
        kube,
        namespace,
        operator,
        "Ready",
        also=lambda s: (
            (s.get("rollout") or {}).get("phase") == "Complete"
            and not old & {p["metadata"]["name"] for p in pods(kube, namespace, ENGINES)}
            and reported(s)
        ),
    )
    assert rollout(kube, namespace)["mode"] == "Engine"
    wait_for(lambda: pool_selects_the_serving_engines(kube, namespace), 30, describe=lambda: by_role(kube, namespace))
    assert by_role(kube, namespace)["active"][0] not in old

    # A daemon generation change: the Service switches to the new generation's hash, and so does the pool.
    selector = kube.get(f"{pools_path(namespace)}/{NAME}")["spec"]["selector"]["matchLabels"]
    assert selector["weightcache.io/daemon-spec-hash"] == before["daemonSpecHash"]
    apply(cluster, namespace, with_routing(MANAGED, version="2", revision="seed-1"))
    after = wait_phase(kube, namespace, operator, "Ready", timeout=400, also=replaced(before))
    wait_for(lambda: pool_selects_the_serving_engines(kube, namespace), 30, describe=lambda: by_role(kube, namespace))
    selector = kube.get(f"{pools_path(namespace)}/{NAME}")["spec"]["selector"]["matchLabels"]
    assert selector["weightcache.io/daemon-spec-hash"] == after["daemonSpecHash"] != before["daemonSpecHash"]

    # Reference mode, to a pool that does not exist yet: said; the managed pool, no longer wanted, is deleted.
    referenced = with_routing({"inferencePool": {"mode": "Reference", "name": "mine"}}, version="2", revision="seed-1")
    apply(cluster, namespace, referenced)
    status = wait_phase(kube, namespace, operator, "Ready", also=said("PoolNotFound"))
    assert status["inferencePool"] == {"name": "mine", "mode": "Reference"}
    wait_for(
        lambda: kube.get(pools_path(namespace))["items"] == [], 30, describe=lambda: kube.get(pools_path(namespace))
    )

    # The user's pool, selecting every engine of the cache: standbys included, which the condition explains.
    wide = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "mine", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"weightcache.io/cache": NAME, "weightcache.io/component": "engine"}},
            "targetPorts": [{"number": 8000}],
            "endpointPickerRef": {"name": "their-epp", "port": {"number": 9002}, "failureMode": "FailOpen"},
        },
    }
    cluster.apply(yaml.safe_dump(wide))
    assert len(selected(kube, namespace, wide["spec"]["selector"]["matchLabels"])) == 2, "active and standby"
    status = wait_phase(kube, namespace, operator, "Ready", also=said("SelectorTooWide"))
    assert "includes standby engines" in condition(status)["message"]
    assert "add weightcache.io/role: active" in condition(status)["message"]

    # Fixed by its owner: accepted, and still exactly as its owner wrote it.
    wide["spec"]["selector"]["matchLabels"]["weightcache.io/role"] = "active"
    cluster.apply(yaml.safe_dump(wide))
    wait_phase(kube, namespace, operator, "Ready", also=said("SelectsServingEngines", ok=True))
    mine = kube.get(f"{pools_path(namespace)}/mine")
    assert selected(kube, namespace, mine["spec"]["selector"]["matchLabels"]) == by_role(kube, namespace)["active"]
    assert "ownerReferences" not in mine["metadata"]
    assert mine["spec"]["endpointPickerRef"]["name"] == "their-epp"

    # Managed again (pool named "mine" is taken: the default name), then the cache deleted: the
    # managed pool goes with it, the referenced one stays as it was.
    apply(cluster, namespace, with_routing(MANAGED, version="2", revision="seed-1"))
    wait_phase(kube, namespace, operator, "Ready", also=said("PoolApplied", ok=True))
    assert pool_selects_the_serving_engines(kube, namespace)
    version = kube.get(f"{pools_path(namespace)}/mine")["metadata"]["resourceVersion"]
    cluster.kubectl("delete", "wc", NAME, "-n", namespace, "--wait=true", "--timeout=90s", timeout=120)

    def managed_gone() -> bool:
        try:
            kube.get(f"{pools_path(namespace)}/{NAME}")
        except ApiError as error:
            return error.status == 404
        return False

    wait_for(managed_gone, 60, describe=lambda: kube.get(pools_path(namespace)))
    assert kube.get(f"{pools_path(namespace)}/mine")["metadata"]["resourceVersion"] == version
