"""deploy/operator.yaml's ClusterRole grants by name only (no wildcard verb, resource or group), and reads
no Secrets: it may only create them (each cache's seeding credential)."""

from __future__ import annotations

from repo_root import ROOT


def test_shipped_cluster_role_names_every_verb_and_resource() -> None:

    import yaml

    deploy = ROOT / "deploy" / "operator.yaml"
    role = next(d for d in yaml.safe_load_all(deploy.read_text()) if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert [r["verbs"] for r in secrets] == [["create"]], "the operator reads no Secrets"
