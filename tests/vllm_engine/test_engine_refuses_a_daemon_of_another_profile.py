"""A reference-profile daemon under the name a vLLM engine maps (same checkpoint, weightcache's own
layout): the engine never maps it. With ``fallback: error`` it refuses to start, naming the
differing fingerprint field and the fix (``--profile vllm``); with ``fallback: disk`` it loads with
vLLM's own loader and logs the same reason. The daemon serves its arena on, untouched."""

from pathlib import Path

import pytest
from vllm_harness import Engine, cache_config, qwen3_checkpoint, start_daemon, vllm_args
from weightcache.client.weights import DaemonConnection
from weightcache_contract.launch import REFERENCE_PROFILE


def test_a_reference_profile_daemon_is_refused_naming_the_profile_or_skipped_to_disk(tmp_path: Path) -> None:
    model, args = qwen3_checkpoint(tmp_path / "qwen3"), vllm_args()
    daemon = start_daemon(model, tmp_path / "sockets", "qwen3", [], logs=tmp_path, profile=REFERENCE_PROFILE)
    try:
        daemon.wait_ready()
        before = daemon.files(0).read_ready()
        assert before is not None and before.fingerprint.engine is None

        log = tmp_path / "engine-error.log"
        with pytest.raises(RuntimeError, match=r"differs in: [^)]*\bengine\b"):
            Engine(model, args, cache=cache_config(daemon, fallback="error"), log=log)
        assert (
            "publishes another load profile than this engine's post-processed layout: start it with `weightcache daemon --profile vllm"
            in log.read_text()
        )
        assert "weightcache daemon --profile vllm --engine-args" in log.read_text()

        log = tmp_path / "engine-disk.log"
        with Engine(model, args, cache=cache_config(daemon, fallback="disk"), log=log) as engine:
            assert [r["mode"] for r in engine.report()] == ["disk"]
            assert len(engine.generate()) == 3
        assert "loading from disk" in log.read_text()
        assert "publishes another load profile" in log.read_text()

        assert daemon.proc.poll() is None
        with DaemonConnection(daemon.files(0).socket) as conn:
            assert conn.query_config().fingerprint_digest == before.fingerprint_digest
    finally:
        daemon.stop()
