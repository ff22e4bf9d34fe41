"""Fixtures for seeding scenarios; the builders are in tests/seeding_builders.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from seeding_builders import write_credential


@pytest.fixture
def credential(tmp_path: Path) -> Callable[..., str]:
    def write(key: bytes | None = None, name: str = "credential") -> str:
        return write_credential(tmp_path / name, key)

    return write
