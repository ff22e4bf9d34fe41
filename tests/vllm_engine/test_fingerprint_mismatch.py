"""An engine whose vLLM arguments differ from the daemon's in a setting that changes the bytes
(here ``--hf-overrides``, which vLLM's post-processing sees through the model config) never maps the
arena: with ``fallback: disk`` it loads with vLLM's own loader and logs which fingerprint field
differs; with ``fallback: error`` it refuses to start, naming the field and the fix."""

import json
from pathlib import Path

import pytest
from vllm_harness import Engine, cache_config, qwen3_checkpoint, start_daemon, vllm_args


def test_a_differing_engine_setting_falls_back_to_disk_with_the_reason_or_refuses_with_error(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    other = [*args, "--hf-overrides", json.dumps({"rms_norm_eps": 1e-5})]
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", args, logs=tmp_path)
    try:
        daemon.wait_ready()
        log = tmp_path / "engine-disk.log"
        with Engine(model, other, cache=cache_config(daemon, fallback="disk"), log=log) as engine:
            assert [r["mode"] for r in engine.report()] == ["disk"]
            assert len(engine.generate()) == 3
        assert "loading from disk" in log.read_text()
        assert "differs in: engine.settings.hf_config_sha256" in log.read_text()

        log = tmp_path / "engine-error.log"
        with pytest.raises(RuntimeError, match="differs in: engine.settings.hf_config_sha256"):
            Engine(model, other, cache=cache_config(daemon, fallback="error"), log=log)
        assert 'set "fallback": "disk"' in log.read_text()
    finally:
        daemon.stop()
