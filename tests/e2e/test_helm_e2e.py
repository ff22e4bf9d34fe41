"""The chart as a user installs it, against the real control plane and the process kubelet:
`helm template` accepted by the API server (server-side dry run); `helm install` → the operator
runs from the chart's Deployment, as pods under the process kubelet authenticating with the
chart's ServiceAccount token (so the API server enforces the chart's RBAC) → the README sample
becomes Ready → `helm upgrade` with a changed value replaces only the operator pods → `helm
uninstall` keeps the CRD and the WeightCache, which is then removed as docs/operations.md says.
The RBAC rules are checked by impersonation, and one real run shows a removed rule is missed."""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from operator_e2e import is_ready
from testcluster.controlplane import ControlPlane
from testcluster.kubelet import ProcessKubelet
from testcluster.rest import ApiError, Kube
from testcluster.sample import DAEMONS, ENGINES, SAMPLE, converged, pods
from testcluster.waiting import wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "weightcache"
CRDS = [REPO / "crds" / "weightcache.yaml", REPO / "crds" / "kopf-peering.yaml"]
OPERATOR = "app.kubernetes.io/name=weightcache-operator"
# Faster than the default 30 s, so "untouched across resyncs" is seen within seconds.
FAST = ("--set", "resyncSeconds=3")


@pytest.fixture
def release(cluster: ControlPlane, namespace: str) -> Iterator[str]:
    """A release name unique to the test (it names the ClusterRole and the peering object);
    uninstalled afterwards if the test left it installed."""
    name = f"wc{uuid.uuid4().hex[:6]}"
    yield name
    if name in cluster.helm("list", "-n", namespace, "-q", check=False).stdout.split():
        cluster.helm("uninstall", name, "-n", namespace, "--wait", "--timeout=60s", check=False)


def rendered(cluster: ControlPlane, release: str, namespace: str, *values: str) -> list[dict]:
    out = cluster.helm("template", release, str(CHART), "-n", namespace, *values).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def operator_pods(kube: Kube, namespace: str, release: str) -> list[dict]:
    found = pods(kube, namespace, f"{OPERATOR},app.kubernetes.io/instance={release}")
    return [p for p in found if not p["metadata"].get("deletionTimestamp")]


def phase(kube: Kube, namespace: str) -> str | None:
    found = kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")
    return (found.get("status") or {}).get("phase")


def whole(kube: Kube, namespace: str) -> bool:
    """Ready with every daemon and engine Ready (the phase alone says only that it serves)."""
    found = kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")
    return converged(found.get("status") or {})


def snapshot(kube: Kube, namespace: str) -> dict[str, tuple[str, int]]:
    """Every daemon and engine pod: uid and the sum of its containers' restart counts."""
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(s["restartCount"] for s in p["status"].get("containerStatuses", [])),
        )
        for p in pods(kube, namespace, f"{DAEMONS.split(',')[0]}")
    }


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def operator_logs(kubelet: ProcessKubelet, namespace: str, release: str) -> str:
    return "\n".join(
        kubelet.logs(namespace, w.name, "operator") for w in kubelet.pods_in(namespace) if w.name.startswith(release)
    )


def test_rendered_chart_passes_server_side_dry_run(cluster: ControlPlane, namespace: str, weightcache_crd: str) -> None:
    """The API server validates every object the chart renders (schemas, RBAC references, the
    peering CR against its CRD, the Grafana dashboard's ConfigMap) without creating anything."""
    cluster.kubectl("apply", "--server-side", "--field-manager=e2e", "-f", str(CRDS[1]))
    cluster.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev", "--timeout=30s")
    for values in (
        [],
        ["--set", f"watchNamespaces={{{namespace}}}", "--set", "logLevel=debug", "--set", "dashboard.enabled=true"],
    ):
        manifest = cluster.helm("template", "dry", str(CHART), "-n", namespace, "--include-crds", *values).stdout
        result = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=manifest)
        applied = result.stdout.splitlines()
        assert len(applied) == len([d for d in yaml.safe_load_all(manifest) if d]), result.stdout
        assert all("(server dry run)" in line for line in applied), result.stdout
        assert "deployment.apps/dry-operator" in result.stdout
        assert ("configmap/dry-operator-dashboard" in result.stdout) == ("dashboard.enabled=true" in values)
    # Nothing was created.
    assert kube_names(cluster, "deployments", namespace) == []


def test_install_without_helm_commands_of_the_readme(
    cluster: ControlPlane, namespace: str, weightcache_crd: str
) -> None:
    """README's commands for clusters without Helm, as written (the Deployment only as a server
    dry run: its name and peering object belong to the default release of the whole cluster)."""
    readme = (REPO / "README.md").read_text()
    assert "kubectl apply -f crds/ && kubectl wait --for condition=established -f crds/" in readme
    cluster.kubectl("apply", "-f", str(REPO / "crds"))
    cluster.kubectl("wait", "--for", "condition=established", "-f", str(REPO / "crds"), "--timeout=30s")
    manifest = (REPO / "deploy" / "operator.yaml").read_text().replace("weightcache-system", namespace)
    result = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=manifest)
    assert "deployment.apps/weightcache-operator created (server dry run)" in result.stdout, result.stdout


def kube_names(cluster: ControlPlane, kind: str, namespace: str) -> list[str]:
    return cluster.kubectl("get", kind, "-n", namespace, "-o", "name").stdout.split()


def test_install_sample_ready_upgrade_rolls_only_the_operator_uninstall_keeps_resources(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    release: str,
    checkpoint: Path,  # noqa: F811
    service_proxy,  # type: ignore[no-untyped-def]
) -> None:
    installed = cluster.helm("install", release, str(CHART), "-n", namespace, *FAST, "--wait", "--timeout=120s")
    assert "kubectl get wc -n NAMESPACE -w" in installed.stdout, installed.stdout

    # Two replicas, run by the process kubelet as the chart's ServiceAccount; peering lets one act.
    first = operator_pods(kube, namespace, release)
    assert len(first) == 2 and all(map(is_ready, first)), first
    assert {p["spec"]["serviceAccountName"] for p in first} == {f"{release}-operator"}
    wait_for(
        lambda: operator_logs(kubelet, namespace, release).count("Resuming operations") >= 1,
        60,
        describe=lambda: operator_logs(kubelet, namespace, release)[-3000:],
    )

    # The README sample, as written, becomes Ready under the chart's operator.
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    wait_for(
        lambda: whole(kube, namespace),
        300,
        interval=0.5,
        describe=lambda: f"{phase(kube, namespace)}\n{operator_logs(kubelet, namespace, release)[-3000:]}",
    )
    before = snapshot(kube, namespace)
    assert len(before) == 4, before  # a daemon per node, the active engine and its standby
    assert len(pods(kube, namespace, DAEMONS)) == 2 and len(pods(kube, namespace, ENGINES)) == 2
    daemonset = kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"][0]

    # The metrics Service reaches both replicas' /metrics; only the acting one counts the cache.
    proxy = service_proxy(namespace, f"{release}-operator-metrics", "metrics")
    proxy.wait_for_ready(2)
    host, port = proxy.address
    assert "# TYPE weightcache_operator_caches gauge" in fetch(f"http://{host}:{port}/metrics")
    counted = [fetch(f"http://{p['status']['podIP']}:9090/metrics") for p in first]
    assert sorted('weightcache_operator_caches{phase="Ready"} 1' in text for text in counted) == [False, True], counted

    # A new chart value rolls the operator's pods and nothing else.
    cluster.helm(
        "upgrade",
        release,
        str(CHART),
        "-n",
        namespace,
        "--reuse-values",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout=120s",
    )
    old = {p["metadata"]["uid"] for p in first}
    wait_for(
        lambda: (
            len(operator_pods(kube, namespace, release)) == 2
            and not old & {p["metadata"]["uid"] for p in operator_pods(kube, namespace, release)}
            and all(map(is_ready, operator_pods(kube, namespace, release)))
        ),
        60,
        describe=lambda: operator_pods(kube, namespace, release),
    )
    for pod in operator_pods(kube, namespace, release):
        variables = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert variables["WEIGHTCACHE_OPERATOR_VERBOSE"] == "1"
    # The new leader takes the cache over (kopf's resume handler, then resyncs every 3 s) ...
    new_names = [p["metadata"]["name"] for p in operator_pods(kube, namespace, release)]

    def new_leader_resynced() -> bool:
        logs = "\n".join(kubelet.logs(namespace, name, "operator") for name in new_names)
        return logs.count("Timer 'resync' succeeded") >= 2

    wait_for(new_leader_resynced, 60, describe=lambda: operator_logs(kubelet, namespace, release)[-4000:])
    # ... and leaves the daemons and engines exactly as they were.
    assert snapshot(kube, namespace) == before
    # The status may have been written while a daemon's exec probe timed out on a loaded 2-core host.
    wait_for(lambda: whole(kube, namespace), 120, describe=lambda: phase(kube, namespace))
    after = kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{daemonset['metadata']['name']}")
    assert after["metadata"]["generation"] == daemonset["metadata"]["generation"]

    # Uninstalling removes the operator only: the CRDs, the WeightCache and its pods stay.
    cluster.helm("uninstall", release, "-n", namespace, "--wait", "--timeout=60s")
    wait_for(lambda: operator_pods(kube, namespace, release) == [], 30)
    assert kube_names(cluster, "deployments", namespace) == []
    for crd in ("weightcaches.weightcache.io", "clusterkopfpeerings.kopf.dev"):
        assert kube.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd}")
    with pytest.raises(ApiError) as gone:
        kube.get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{release}-operator")
    assert gone.value.status == 404
    assert kube.get(f"/apis/weightcache.io/v1alpha1/namespaces/{namespace}/weightcaches/tiny-llama")
    assert snapshot(kube, namespace) == before

    # docs/operations.md: without an operator nothing removes the finalizer; remove it, and the
    # garbage collector deletes what the WeightCache owns.
    cluster.kubectl(
        "patch", "wc", "tiny-llama", "-n", namespace, "--type=merge", "-p", '{"metadata":{"finalizers":null}}'
    )
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=30s")
    wait_for(
        lambda: pods(kube, namespace, "weightcache.io/cache=tiny-llama") == [],
        90,
        describe=lambda: [p["metadata"]["name"] for p in pods(kube, namespace, "weightcache.io/cache=tiny-llama")],
    )
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []


def can_i(cluster: ControlPlane, account: str, verb: str, target: str, namespace: str | None, sub: str = "") -> bool:
    args = ["auth", "can-i", verb, target, f"--as={account}"]
    args += ["-n", namespace] if namespace else []
    args += [f"--subresource={sub}"] if sub else []
    result = cluster.kubectl(*args, check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip() == "yes"


def rule_checks(rules: list[dict]) -> Iterator[tuple[str, str, str]]:
    """(verb, type[/name], subresource) for every verb of every rule, as `kubectl auth can-i`
    spells them."""
    for rule in rules:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                base, _, sub = resource.partition("/")
                spelled = f"{base}.{group}" if group else base
                for name in rule.get("resourceNames", [None]):
                    for verb in rule["verbs"]:
                        yield verb, f"{spelled}/{name}" if name else spelled, sub


def test_rbac_grants_exactly_the_rules_and_a_missing_rule_stops_the_operator(
    cluster: ControlPlane,
    kube: Kube,
    kubelet: ProcessKubelet,
    namespace: str,
    release: str,
    weightcache_crd: str,
) -> None:
    """Namespaced install (watchNamespaces): by impersonation the ServiceAccount can do what the
    rules list, in that namespace only; then a real run with the Role's DaemonSet rule removed
    creates no DaemonSet and logs 403, and restoring the chart's Role lets the pass complete."""
    values = ("--set", f"watchNamespaces={{{namespace}}}", *FAST)
    objects = rendered(cluster, release, namespace, *values)
    role = next(o for o in objects if o["kind"] == "Role")
    cluster_role = next(o for o in objects if o["kind"] == "ClusterRole")
    cluster.helm(
        "install", release, str(CHART), "-n", namespace, *values, "--set", "replicaCount=1", "--wait", "--timeout=120s"
    )
    account = f"system:serviceaccount:{namespace}:{release}-operator"
    other = "kube-system"
    checked = 0
    for verb, target, sub in rule_checks(role["rules"]):
        assert can_i(cluster, account, verb, target, namespace, sub), (verb, target, sub)
        assert not can_i(cluster, account, verb, target, other, sub), f"{verb} {target} leaks outside {namespace}"
        checked += 1
    for verb, target, sub in rule_checks(cluster_role["rules"]):
        assert can_i(cluster, account, verb, target, None, sub), (verb, target, sub)
        checked += 1
    assert checked == 49, checked  # every verb of every rule of the chart (tests/unit/chart/helm_chart.py lists them)
    for verb, target in [
        ("get", "secrets"),
        ("list", "configmaps"),
        ("delete", "nodes"),
        ("create", "deployments.apps"),
        ("patch", "clusterkopfpeerings.kopf.dev/weightcache-operator"),
        ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ]:
        assert not can_i(cluster, account, verb, target, namespace), (verb, target)

    # One real run without the DaemonSet rule: the API server refuses, the operator says so.
    daemonset_rule = next(i for i, r in enumerate(role["rules"]) if r["resources"] == ["daemonsets"])
    operator = operator_pods(kube, namespace, release)
    assert len(operator) == 1
    cluster.kubectl(
        "patch",
        "role",
        f"{release}-operator",
        "-n",
        namespace,
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": f"/rules/{daemonset_rule}"}]),
    )
    assert not can_i(cluster, account, "create", "daemonsets.apps", namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", str(SAMPLE))
    wait_for(
        lambda: "daemonsets.apps" in (logs := operator_logs(kubelet, namespace, release)) and "forbidden" in logs,
        60,
        describe=lambda: operator_logs(kubelet, namespace, release)[-3000:],
    )
    assert kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"] == []
    assert phase(kube, namespace) != "Ready"
    # Refused as the chart's ServiceAccount: the pod used its projected token, not an admin's.
    refused = [line for line in operator_logs(kubelet, namespace, release).splitlines() if "forbidden" in line]
    assert refused and all(account in line for line in refused), refused[:3]

    # The rule back: the operator's next retry creates the DaemonSet.
    cluster.kubectl(
        "patch",
        "role",
        f"{release}-operator",
        "-n",
        namespace,
        "--type=json",
        "-p",
        json.dumps([{"op": "add", "path": f"/rules/{daemonset_rule}", "value": role["rules"][daemonset_rule]}]),
    )
    assert can_i(cluster, account, "create", "daemonsets.apps", namespace)
    wait_for(
        lambda: kube.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets")["items"],
        60,
        describe=lambda: operator_logs(kubelet, namespace, release)[-3000:],
    )
    # Delete while the operator runs, so its finalizer completes.
    cluster.kubectl("delete", "wc", "tiny-llama", "-n", namespace, "--wait=true", "--timeout=90s", timeout=100)
