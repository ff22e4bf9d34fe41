"""The chart's RBAC is exactly the rules enumerated in helm_chart.py: cluster-wide or per watched
namespace, InferencePool rights only with routing enabled, and the operator's namespaces setting agreeing
with the namespaces that get roles."""

from __future__ import annotations

from helm_chart import INFERENCE_POOL_RULE, NAMESPACE_WATCH, NAMESPACED_RULES, cluster_rules, env, kinds, only, render
from weightcache_operator.settings import watched_namespaces


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
    # Seeding: Secrets only created (never read), ConfigMaps only read and applied (never listed or deleted).
    assert [r["verbs"] for r in NAMESPACED_RULES if "secrets" in r["resources"]] == [["create"]]
    assert [r["verbs"] for r in NAMESPACED_RULES if "configmaps" in r["resources"]] == [["get", "create", "patch"]]


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
