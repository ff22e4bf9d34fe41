"""Unit tests import their builders by bare module name: tests/unit/conftest.py
puts every folder of modules below it on ``sys.path``. A bare name must therefore say one module. Two
modules of one name would not fail: the first on the path would silently stand in for the second. And a
folder on the path makes each folder inside it importable as a namespace package wherever no real package
of that name is installed: a test folder named ``vllm`` inside one would be ``import vllm`` on a machine
without vLLM."""

from __future__ import annotations

import ast
import importlib.util
import sys
from collections import defaultdict
from pathlib import Path

from repo_root import ROOT

UNIT = ROOT / "tests" / "unit"


def modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if p.name != "conftest.py")


def test_no_two_unit_test_modules_share_a_name() -> None:
    places: dict[str, list[str]] = defaultdict(list)
    for path in modules(UNIT):
        places[path.stem].append(str(path.relative_to(UNIT)))
    assert {name: where for name, where in places.items() if len(where) > 1} == {}


def test_each_unit_test_modules_name_imports_that_module() -> None:
    """Not another suite's helper (``make test`` collects every suite in one session, each suite's folders
    on the path), not a standard or installed module."""
    for path in modules(UNIT):
        spec = importlib.util.find_spec(path.stem)
        assert spec is not None and spec.origin == str(path), (path, spec and spec.origin)


def test_no_other_suite_has_a_module_of_a_unit_test_modules_name() -> None:
    unit = {path.stem for path in modules(UNIT)}
    others = [
        path
        for path in modules(ROOT / "tests")
        if UNIT not in path.parents and not (path.parent / "__init__.py").exists()
    ]
    assert [str(path.relative_to(ROOT)) for path in others if path.stem in unit] == []


def test_a_folder_of_modules_holds_no_folders() -> None:
    """tests/unit itself holds folders, so no module but its conftest: each sits in a room's folder."""
    assert [path.name for path in UNIT.glob("*.py")] == ["conftest.py"]
    for folder in sorted({path.parent for path in modules(UNIT)}):
        inside = [p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__"]
        assert inside == [], folder


def test_no_top_folder_of_the_unit_tests_is_named_like_a_package_the_code_imports() -> None:
    """tests/unit itself is on the path (pytest puts a conftest's folder there), so its folders are the
    ones that could stand in for a package."""
    imported: set[str] = set()
    for part in ("contract", "daemon_image", "operator", "tests", "tools", "benchmarks"):
        for source in (ROOT / part).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text(), str(source))):
                if isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported.add(node.module.split(".")[0])
    folders = {p.name for p in UNIT.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert sorted(folders & imported - set(sys.stdlib_module_names)) == []
