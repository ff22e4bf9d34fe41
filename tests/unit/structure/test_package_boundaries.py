"""The operator image carries weightcache_contract and weightcache_operator only (no torch, no data
plane), so the operator must never import the data plane (``weightcache``) or torch, and the
contract, which both sides import, must import neither side. Checked in fresh interpreters that
could import everything (the whole checkout on the path), so a stray import shows up as a loaded
module, not as an ImportError that some other path might hide. Inside the data plane, a package
imports only packages below it."""

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

from repo_root import ROOT

PATH = [str(ROOT / part) for part in ("contract", "daemon_image", "operator")]

# Prints, for each module imported in turn, the forbidden top-level packages it brought in.
PROBE = """
import importlib, json, sys
forbidden = set(sys.argv[2].split(","))
found = {}
for name in sys.argv[1].split(","):
    importlib.import_module(name)
    found[name] = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
print(json.dumps(found))
"""


def modules(package_dir: Path, package: str) -> list[str]:
    names = [package]
    for info in pkgutil.walk_packages([str(package_dir)], prefix=f"{package}."):
        names.append(info.name)
    return names


def forbidden_imports(names: list[str], forbidden: list[str]) -> dict[str, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", PROBE, ",".join(names), ",".join(forbidden)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*PATH, *sys.path])},
    )
    return {name: loaded for name, loaded in json.loads(result.stdout).items() if loaded}


OPERATOR_MODULES = modules(ROOT / "operator" / "weightcache_operator", "weightcache_operator")
CONTRACT_MODULES = modules(ROOT / "contract" / "weightcache_contract", "weightcache_contract")


def test_every_operator_module_is_found() -> None:
    assert {"weightcache_operator.run.handlers", "weightcache_operator.render.daemon"} <= set(OPERATOR_MODULES)


def test_operator_modules_import_neither_the_data_plane_nor_torch() -> None:
    found = forbidden_imports(OPERATOR_MODULES, ["weightcache", "torch", "numpy"])
    assert not found, f"operator modules reach past the contract (import from weightcache_contract instead): {found}"


def test_contract_modules_import_neither_side_nor_torch() -> None:
    found = forbidden_imports(CONTRACT_MODULES, ["weightcache", "weightcache_operator", "torch", "numpy"])
    assert not found, f"the contract must stand alone (standard library and pydantic): {found}"


def test_the_check_sees_a_forbidden_import() -> None:
    """The check itself: importing the data plane's CLI is seen as loading ``weightcache``."""
    found = forbidden_imports(["weightcache.cli"], ["weightcache"])
    assert "weightcache.cli" in found.get("weightcache.cli", []), found


# The data plane's packages, lowest first; a package may import only those before it (and the
# top-level helpers). ``checkpoints`` and ``gpu`` are both at the bottom and import neither other.
# ``engine_profiles`` is what every engine profile shares (the publisher core, publishing and
# binding); each engine's own package (``sglang``, ``vllm``: its publisher and load format) is above it, and
# nothing in the data plane may need an engine.
DATA_PLANE_ORDER = [
    {"checkpoints", "gpu", "artifacts"},
    {"wire"},
    {"arenas"},
    {"client", "seeding"},
    {"daemon"},
    {"engine"},
    {"tools"},
    {"engine_profiles"},
    {"sglang", "vllm"},
]
HELPERS = {"logfmt", "gcpause", "status_note", "arguments", "profiles", "__version__"}


def data_plane_imports() -> dict[str, set[str]]:
    """Each data-plane subpackage → the other top-level parts of ``weightcache`` it imports (relative
    imports, including the ones inside functions)."""
    import ast

    found: dict[str, set[str]] = {}
    root = ROOT / "daemon_image"
    for source in (root / "weightcache").rglob("*.py"):
        parts = source.relative_to(root).with_suffix("").parts
        if len(parts) < 3:
            continue
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = list(parts[:-1])[: len(parts) - node.level]
                targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
                for target in targets:
                    if target[1] != parts[1]:
                        found.setdefault(parts[1], set()).add(target[1])
    return found


def test_data_plane_packages_import_only_lower_ones() -> None:
    allowed: set[str] = set()
    wrong = {}
    for level in DATA_PLANE_ORDER:
        for package in level:
            above = data_plane_imports().get(package, set()) - allowed - HELPERS
            if above:
                wrong[package] = sorted(above)
        allowed |= level
    assert not wrong, f"packages importing their own level or above (move the shared piece down): {wrong}"


def test_the_layer_check_sees_every_package() -> None:
    packages = {p.name for p in (ROOT / "daemon_image" / "weightcache").iterdir() if (p / "__init__.py").exists()}
    assert packages == set().union(*DATA_PLANE_ORDER)


def test_publishing_binding_and_the_handoff_import_no_vllm() -> None:
    """A GPU host without vLLM's CUDA build (and tests/gpu) publishes, hands over and binds with these."""
    modules = [
        "weightcache.engine_profiles.publish",
        "weightcache.engine_profiles.bind",
        "weightcache.engine_profiles.publisher",
    ]
    assert not forbidden_imports([*modules, "weightcache.daemon.handoff"], ["vllm"])


# The operator's rooms, lowest first: a module imports from its own room and the rooms below,
# never above (observing does not decide, deciding does not write, writing does not schedule
# passes). Below every room, the floor: the vocabulary, typed views (objects.py), the API client,
# the settings, the API (spec/), the renderers (render/) and the engine profiles (profiles/).
# The entry points (``python -m weightcache_operator``, ``…crd``) may import anything.
OPERATOR_ROOMS = ["observe", "plan", "act", "run"]
OPERATOR_FLOOR = {"vocabulary", "objects", "kubeapi", "settings", "together", "spec", "render", "profiles"}
OPERATOR_ENTRY_POINTS = {"__main__", "crd"}


def operator_imports() -> list[tuple[str, str]]:
    """(importing module's top-level part, imported top-level part) for every import inside
    ``weightcache_operator``, absolute or relative, including the ones inside functions."""
    import ast

    root = ROOT / "operator"
    found = []
    for source in (root / "weightcache_operator").rglob("*.py"):
        parts = source.relative_to(root).with_suffix("").parts
        package = list(parts[:-1]) if parts[-1] != "__init__" else list(parts[:-1])
        for node in ast.walk(ast.parse(source.read_text())):
            targets: list[list[str]] = []
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package[: len(package) - (node.level - 1)]
                targets = [base + node.module.split(".")] if node.module else [base + [a.name] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("weightcache_operator"):
                base = node.module.split(".")
                targets = [base] if len(base) > 1 else [base + [a.name] for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".") for a in node.names if a.name.startswith("weightcache_operator.")]
            found += [(parts[1], target[1]) for target in targets if len(target) > 1 and target[1] != parts[1]]
    return found


def room_rank(part: str) -> int:
    if part in OPERATOR_ENTRY_POINTS:
        return len(OPERATOR_ROOMS) + 1
    return OPERATOR_ROOMS.index(part) + 1 if part in OPERATOR_ROOMS else 0


def test_every_operator_module_is_in_a_room_on_the_floor_or_an_entry_point() -> None:
    """A new top-level module is a decision: name its room here, or put it in one."""
    parts = {
        p.stem
        for p in (ROOT / "operator" / "weightcache_operator").iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert parts - {"__init__"} == set(OPERATOR_ROOMS) | OPERATOR_FLOOR | OPERATOR_ENTRY_POINTS


def test_operator_rooms_import_only_their_own_and_lower_ones() -> None:
    wrong = sorted({f"{a} -> {b}" for a, b in operator_imports() if room_rank(b) > room_rank(a)})
    assert not wrong, f"imports from a higher room (move the shared piece down, or the caller up): {wrong}"


def test_the_room_check_sees_an_import_upwards() -> None:
    """The check itself: the pass runner imports the executor (run -> act), which it may, and the
    ranks say that the reverse would be refused."""
    assert ("run", "act") in operator_imports() and room_rank("act") > room_rank("observe") > room_rank("render")


# Imports each module as the first of its package, in one interpreter (a module's cycle shows up
# only when the import starts there: an order that happens to work elsewhere hides it).
PROBE_ALONE = """
import importlib, json, sys
failed = {}
for name in sys.argv[1].split(","):
    for loaded in [m for m in sys.modules if m.split(".")[0] == sys.argv[2]]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except ImportError as error:
        failed[name] = str(error)
print(json.dumps(failed))
"""


def test_every_operator_module_imports_first() -> None:
    names = [n for n in OPERATOR_MODULES if not n.endswith("__main__")]
    result = subprocess.run(
        [sys.executable, "-c", PROBE_ALONE, ",".join(names), "weightcache_operator"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([*PATH, *sys.path])},
    )
    failed = json.loads(result.stdout)
    assert not failed, f"import cycles (move what both need to the floor below them): {failed}"
