"""The vLLM engine's startup timeline (daemon_image/weightcache/vllm/startup.py), the parts that need
no vLLM: which log records end which phase, and how the processes' marks are put together.
tests/vllm_engine/test_vllm_serve_reports_its_startup_phases.py runs ``vllm serve`` for real."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from weightcache.engine.timeline import PHASES
from weightcache.vllm.startup import UVICORN_READY, collected, phase_of


def record(msg: object, *args: object) -> logging.LogRecord:
    return logging.LogRecord("vllm.v1.engine.core", logging.INFO, "core.py", 1, msg, args or None, None)


def test_vllm_s_own_lines_end_phases_by_their_format_string_whatever_the_values() -> None:
    warmup = "init engine (profile, create kv cache, warmup model) took %.2f seconds"
    assert phase_of(record(warmup, 12.5)) == "warmup"
    compiled = "init engine (profile, create kv cache, warmup model) took %.2f s (compilation: %.2f s)"
    assert phase_of(record(compiled, 30.0, 12.0)) == "warmup"
    assert phase_of(record("%storch.compile took %.2f s in total", "", 3.1)) == "compile"
    assert phase_of(record("torch.compile takes %.2f s in total", 3.1)) == "compile"  # vLLM 0.26
    assert phase_of(record("Graph capturing finished in %.0f secs, took %.2f GiB", 3, 0.3)) == "compile"
    assert phase_of(record(UVICORN_READY)) == "ready"
    assert phase_of(record("Loading weights took %.2f seconds", 1.0)) is None
    assert phase_of(record(ValueError("not a string"))) is None


def test_the_phases_are_the_reference_engine_s_with_compile_before_the_warm_up() -> None:
    assert PHASES == ("imports", "distributed_init", "weights_bound", "compile", "warmup", "ready")


def test_marks_of_every_process_are_collected_by_rank_and_the_latest_end_of_a_phase_wins(tmp_path: Path) -> None:
    (tmp_path / "100.json").write_text(json.dumps({"rank": 0, "marks": {"imports": 4.0, "ready": 30.5}}))
    (tmp_path / "101.json").write_text(json.dumps({"rank": 0, "marks": {"weights_bound": 12.0, "warmup": 20.0}}))
    (tmp_path / "102.json").write_text(json.dumps({"rank": 1, "marks": {"weights_bound": 12.5}}))
    (tmp_path / "103.json").write_text("{half a fil")  # a reader never sees one (os.replace), but skips it
    (tmp_path / "104.json").write_text(json.dumps({"rank": 0, "marks": {"warmup": 21.0}}))
    assert collected(tmp_path) == {
        (0, "imports"): 4.0,
        (0, "ready"): 30.5,
        (0, "weights_bound"): 12.0,
        (0, "warmup"): 21.0,
        (1, "weights_bound"): 12.5,
    }
