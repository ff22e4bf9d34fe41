"""The termination message a weightcache process leaves: only where it is told to, and never more
than Kubernetes keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from weightcache_contract import termination


def test_a_message_goes_only_where_the_environment_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(termination.ENV, raising=False)
    termination.write("nowhere")  # no variable: a daemon run by hand writes nothing
    target = tmp_path / "termination-log"
    monkeypatch.setenv(termination.ENV, str(target))
    termination.write("num_attention_heads=8 is not divisible by tensor-parallel size 3")
    assert termination.read(target) == "num_attention_heads=8 is not divisible by tensor-parallel size 3"
    assert termination.read(tmp_path / "absent") is None


def test_a_long_message_is_cut_to_what_kubernetes_keeps_on_a_character_boundary(tmp_path: Path) -> None:
    target = tmp_path / "termination-log"
    termination.write("é" * 3000, str(target))  # 6000 bytes of two-byte characters
    data = target.read_bytes()
    assert len(data) == termination.LIMIT_BYTES and data.decode() == "é" * 2048


def test_failing_to_write_never_raises(tmp_path: Path) -> None:
    termination.write("why", str(tmp_path / "no" / "such" / "dir" / "file"))
