"""The SGLang tests run in the SGLang environment (``make test-sglang``): this process imports
SGLang too (its parser, in the refusal tests), so the kernel stand-in goes on its path here as it
does for every process the harness starts."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sglang_harness import STAND_IN

sys.path.insert(0, str(STAND_IN))
# The demo's test shares the demo checks (tests/e2e).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))


@pytest.fixture
def calls(tmp_path: Path) -> Iterator[Path]:
    """Where the stand-in records a call to SGLang's kernels; the test's SGLang processes called none."""
    record = tmp_path / "sgl_kernel-calls"
    yield record
    assert not record.exists(), f"SGLang called its kernel library's stand-in: {record.read_text()}"
