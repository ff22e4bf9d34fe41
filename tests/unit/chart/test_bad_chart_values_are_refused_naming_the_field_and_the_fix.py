"""Values the chart cannot install are refused before anything is applied: inconsistent ones by the
templates with the fix, malformed ones by values.schema.json naming the field."""

from __future__ import annotations

import pytest
from helm_chart import CHART, run_helm


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
