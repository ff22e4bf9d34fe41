"""The test environment's ``sgl_kernel`` (stand_in/) only lets SGLang's imports succeed: any
function of it or of a submodule raises and is recorded (where the ``calls`` fixture of every
SGLang test looks), and ``sgl_kernel.scalar_type`` stays absent so SGLang takes its own fallback."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from sglang_harness import CALLS_ENV


def test_a_call_raises_and_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "calls"
    monkeypatch.setenv(CALLS_ENV, str(record))
    sgl_kernel = importlib.import_module("sgl_kernel")
    assert "stand.in" in sgl_kernel.__version__
    with pytest.raises(RuntimeError, match="copy_all_layer_kv_cache_cpu is the test stand-in"):
        sgl_kernel.copy_all_layer_kv_cache_cpu(1, 2)
    from sgl_kernel.allreduce import all_reduce  # type: ignore[import-not-found]

    with pytest.raises(RuntimeError):
        all_reduce()
    assert [line.split()[1] for line in record.read_text().splitlines()] == [
        "sgl_kernel.copy_all_layer_kv_cache_cpu",
        "sgl_kernel.allreduce.all_reduce",
    ]
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel.scalar_type")
