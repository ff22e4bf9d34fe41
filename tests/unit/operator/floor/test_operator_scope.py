"""$WEIGHTCACHE_OPERATOR_NAMESPACES → the namespaces kopf serves (the chart sets it from
watchNamespaces; tests/unit/chart/test_the_chart_grants_exactly_the_enumerated_rbac_rules.py checks
the two agree)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from repo_root import ROOT
from weightcache_operator.settings import NAMESPACES as VARIABLE
from weightcache_operator.settings import watched_namespaces


@pytest.mark.parametrize(
    ("text", "expected"),
    [(None, []), ("", []), (" , ", []), ("team-a", ["team-a"]), ("team-b, team-a,team-b", ["team-a", "team-b"])],
)
def test_lists_exact_names_or_nothing_for_cluster_wide(text: str | None, expected: list[str]) -> None:
    assert watched_namespaces({} if text is None else {VARIABLE: text}) == expected


@pytest.mark.parametrize("bad", ["Team-A", "team_a", "team-*", "!kube-system", "-a", "a" * 64])
def test_refuses_what_is_not_a_namespace_name(bad: str) -> None:
    with pytest.raises(ValueError) as raised:
        watched_namespaces({VARIABLE: f"ok,{bad}"})
    assert f"{bad!r} is not a namespace name" in str(raised.value) and "unset it" in str(raised.value)


def test_operator_exits_with_the_message_before_connecting() -> None:
    """A real ``python -m weightcache_operator`` with no cluster to reach: the bad setting is
    reported (exit 1) before kopf starts, not as a login error."""
    result = subprocess.run(
        [sys.executable, "-m", "weightcache_operator"],
        env={
            "PYTHONPATH": f"{ROOT / 'contract'}:{ROOT / 'operator'}",
            VARIABLE: "Team-A",
            "KUBECONFIG": "/nonexistent",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert (
        "weightcache-operator: WEIGHTCACHE_OPERATOR_NAMESPACES='Team-A': 'Team-A' is not a namespace name"
        in result.stderr
    )
