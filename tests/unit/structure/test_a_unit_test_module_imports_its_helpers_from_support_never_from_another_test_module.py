"""What tests share lives in a room's support/ folder: a test module that imported another would run
that module's import-time code and tie its helpers to that module's tests, so splitting, moving or
renaming a test file would break tests elsewhere. Every import is read from the modules' syntax trees,
those inside a function included: a late import is still an import."""

from __future__ import annotations

import ast
from pathlib import Path

from repo_root import ROOT

TESTS = ROOT / "tests"
UNIT = TESTS / "unit"


def is_test_module(path: Path) -> bool:
    """What pytest collects as a test module (its default ``python_files``, which pyproject.toml keeps)."""
    return path.name.startswith("test_") or path.stem.endswith("_test")


def imported(path: Path) -> set[str]:
    """The top-level names of the modules ``path`` imports, anywhere in it."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_unit_test_module_or_helper_imports_a_test_module() -> None:
    """Any suite's test module counts: ``make test`` collects every suite in one session."""
    tests = {path.stem for path in TESTS.rglob("*.py") if is_test_module(path)}
    found = {
        str(path.relative_to(UNIT)): sorted(imported(path) & tests)
        for path in sorted(UNIT.rglob("*.py"))
        if imported(path) & tests
    }
    assert found == {}, f"move what they share into the room's support/ folder: {found}"
