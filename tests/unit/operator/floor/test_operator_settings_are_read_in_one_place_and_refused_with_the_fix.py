"""The operator's ``$WEIGHTCACHE_OPERATOR_*`` settings: one object, read in one module, each bad
value refused with the variable's name and the fix before kopf starts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from repo_root import ROOT
from weightcache_operator import settings
from weightcache_operator.settings import OperatorSettings

PACKAGE = ROOT / "operator" / "weightcache_operator"


def test_unset_variables_take_the_defaults() -> None:
    assert OperatorSettings.from_environment({}) == OperatorSettings()
    blank = {name: " " for name in (settings.RESYNC_SECONDS, settings.HEALTH, settings.PEERING_LIFETIME)}
    assert OperatorSettings.from_environment(blank) == OperatorSettings()


def test_given_values_are_taken() -> None:
    given = OperatorSettings.from_environment(
        {
            settings.NAMESPACES: "team-b,team-a",
            settings.VERBOSE: "1",
            settings.HEALTH: "127.0.0.1:8081",
            settings.METRICS: "[::]:9091",
            settings.RESYNC_SECONDS: "2.5",
            settings.PASS_THREADS: "3",
            settings.PEERING: "wc-release.team-a",
            settings.PEERING_LIFETIME: "7",
            settings.PRIORITY: "4b6c-uid",
        }
    )
    assert given == OperatorSettings(
        namespaces=("team-a", "team-b"),
        verbose=True,
        health="127.0.0.1:8081",
        metrics="[::]:9091",
        resync_seconds=2.5,
        pass_threads=3,
        peering="wc-release.team-a",
        peering_lifetime=7,
        priority="4b6c-uid",
    )


@pytest.mark.parametrize(
    ("variable", "text", "fix"),
    [
        (settings.RESYNC_SECONDS, "soon", "give a number of seconds above 0 and below 86400, or unset it for 30"),
        (settings.RESYNC_SECONDS, "0", "give a number of seconds above 0"),
        (settings.RESYNC_SECONDS, "nan", "give a number of seconds above 0"),
        (settings.RESYNC_SECONDS, "inf", "give a number of seconds above 0"),
        (settings.PEERING_LIFETIME, "2.5", "give a whole number of seconds above 0 and below 86400"),
        (settings.PEERING_LIFETIME, "-1", "give a whole number of seconds"),
        (settings.HEALTH, "8080", "is not HOST:PORT (e.g. 0.0.0.0:9400 or [::]:9400); or unset it for 0.0.0.0:8080"),
        (settings.METRICS, "metrics:port", "is not HOST:PORT"),
        (settings.PEERING, "WeightCache_Operator", "is not an object name"),
        (settings.PASS_THREADS, "lots", "give a whole number of threads from 1 to 256"),
        (settings.NAMESPACES, "team-*", "is not a namespace name"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable_and_the_fix(variable: str, text: str, fix: str) -> None:
    with pytest.raises(ValueError) as raised:
        OperatorSettings.from_environment({variable: text})
    message = str(raised.value)
    assert variable in message and repr(text) in message and fix in message, message


def test_the_operator_exits_with_the_message_before_importing_its_handlers() -> None:
    """A real ``python -m weightcache_operator`` with a bad resync and no cluster to reach: one
    line naming the variable (exit 1), not a traceback from the import that registers the timer."""
    result = subprocess.run(
        [sys.executable, "-m", "weightcache_operator"],
        env={
            "PYTHONPATH": f"{ROOT / 'contract'}:{ROOT / 'operator'}",
            settings.RESYNC_SECONDS: "soon",
            "KUBECONFIG": "/nonexistent",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "weightcache-operator: WEIGHTCACHE_OPERATOR_RESYNC_SECONDS='soon': give a number of seconds above 0"
        " and below 86400, or unset it for 30"
    ), result.stderr


def environment_readers(path: Path) -> list[str]:
    """Where a module reads the process environment: ``os.environ`` or ``os.getenv`` (as the
    parser sees the code, so a comment or a string that mentions them does not count)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv", "environb"}:
            found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                f"{path.relative_to(PACKAGE)}:{node.lineno}"
                for a in node.names
                if a.name.startswith(("environ", "getenv"))
            ]
    return found


def test_no_operator_module_but_settings_reads_the_environment() -> None:
    readers = [where for path in sorted(PACKAGE.rglob("*.py")) for where in environment_readers(path)]
    assert readers and all(where.startswith("settings.py:") for where in readers), readers
