"""charts/weightcache as installed with its defaults: it lints (also with namespaced values), and renders a
cluster-wide operator of two locked-down replicas running the operator image's entry point."""

from __future__ import annotations

import json
import re

from helm_chart import CHART, container, env, kinds, only, render, run_helm
from repo_root import ROOT


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
