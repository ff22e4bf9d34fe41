"""Values other than the defaults reach the objects they set; the metrics Service and the Grafana
dashboard's ConfigMap come and go with their values."""

from __future__ import annotations

import json
import subprocess

import yaml
from helm_chart import CHART, NAMESPACED_RULES, cluster_rules, container, env, kinds, only, render


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
