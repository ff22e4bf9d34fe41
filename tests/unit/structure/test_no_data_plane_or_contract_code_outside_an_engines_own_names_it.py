"""An engine is one package on the data plane (``weightcache/<engine>/``, its load profile, parser,
publisher rank and engine-side loader) above what every engine shares (``engine_profiles``), and
one constant in the contract (its profile's name): no other data-plane module names an engine in
its code (prose may), and no flag, command field or variable of the contract is an engine's."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from engine_words import words_of
from repo_root import ROOT
from weightcache_contract import launch
from weightcache_contract.launch import PROFILES, REFERENCE_PROFILE
from weightcache_contract.options import Option, options_of

DATA_PLANE = ROOT / "daemon_image" / "weightcache"
ENGINES = set(PROFILES) - {REFERENCE_PROFILE}
REGISTRY = DATA_PLANE / "profiles.py"
"""Lists the built-in profiles' modules (``BUILTIN``), as the operator's ``profiles/__init__`` does."""


def mentions(source: str, where: str) -> set[str]:
    """Identifiers with an engine's name as a word, strings that are an engine's profile name, and
    imports of an engine's package, in ``source``'s syntax tree (comments and docstrings aside)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        line = f"{where}:{getattr(node, 'lineno', 0)}"
        names: list[str] = []
        if isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")
            found |= {f"{line} imports {node.module}" for e in ENGINES if e in module}
            names += [a.asname or a.name for a in node.names]
        elif isinstance(node, ast.Import):
            found |= {f"{line} imports {a.name}" for a in node.names for e in ENGINES if e in a.name.split(".")}
        elif isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            names.append(node.name)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in ENGINES:
            found.add(f"{line} has the string {node.value!r}")
        found |= {f"{line} names {n}" for n in names if words_of(n) & ENGINES}
    return found


def test_the_check_sees_an_engine_named_in_code_but_not_in_prose() -> None:
    source = '''
from ..vllm.loader import WRITTEN_IN_PLACE
import weightcache.vllm.stamp

def run(vllm_config, profile="vllm"):
    """vLLM's config, as the vllm profile loads it"""  # vllm in a comment
    return vllm_config
'''
    assert mentions(source, "m") == {
        "m:2 imports vllm.loader",
        "m:3 imports weightcache.vllm.stamp",
        "m:5 names vllm_config",
        "m:5 has the string 'vllm'",
        "m:7 names vllm_config",
    }


def test_no_data_plane_module_outside_an_engines_package_names_an_engine() -> None:
    assert ENGINES, "the contract names no engine profile"
    found: set[str] = set()
    for path in sorted(DATA_PLANE.rglob("*.py")):
        relative = path.relative_to(DATA_PLANE)
        if relative.parts[0] in ENGINES or path == REGISTRY:
            continue
        found |= mentions(path.read_text(), str(relative))
    assert not found, f"move engine-specific code into the engine's package (weightcache/<engine>/): {sorted(found)}"


def test_no_flag_command_field_or_variable_of_the_contract_is_an_engines() -> None:
    options = [o for o in vars(launch).values() if isinstance(o, Option)]
    commands = [
        c
        for c in vars(launch).values()
        if isinstance(c, type) and issubclass(c, launch.Launch) and c is not launch.Launch
    ]
    spelled = {o.flag for o in options} | {o.dest for c in commands for o in options_of(c)}
    spelled |= {f.name for c in commands for f in dataclasses.fields(c)}
    named = sorted(s for s in spelled if words_of(s.lstrip("-").replace("-", "_")) & ENGINES)
    assert not named, f"name these after what they are for, not after one engine: {named}"


def test_the_engine_packages_are_the_built_in_profiles_beside_the_reference_one() -> None:
    packages = {p.name for p in DATA_PLANE.iterdir() if (p / "profile.py").exists() and p.name in ENGINES}
    assert packages == ENGINES and all((DATA_PLANE / e / "__init__.py").exists() for e in ENGINES)
    assert Path(REGISTRY).exists()
