"""charts/weightcache rendered by the real helm binary, for the chart's tests (the helm fixture is
conftest.py's): rendering with a set of values, picking objects out of the result, and the RBAC rules
the chart must grant."""

from __future__ import annotations

import subprocess
from typing import Any

import yaml
from repo_root import ROOT

CHART = ROOT / "charts" / "weightcache"

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
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
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
