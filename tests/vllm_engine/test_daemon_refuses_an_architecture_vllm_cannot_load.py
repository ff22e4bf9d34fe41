"""A checkpoint whose config.json names an architecture vLLM does not know: the vLLM-profile daemon
exits before it claims the rank, naming the architecture and the fix, not with a traceback."""

import json
from pathlib import Path

from vllm_harness import qwen3_checkpoint, start_daemon, vllm_args

ARCH = "WeightcacheTestUnknownForCausalLM"


def test_an_unknown_architecture_stops_the_daemon_naming_it(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "unknown")
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "architectures": [ARCH]}))
    daemon = start_daemon(model, tmp_path / "sockets", "unknown", vllm_args(), logs=tmp_path)
    assert daemon.proc.wait(timeout=600) != 0
    out = daemon.log.read_text()
    assert f"Model architectures ['{ARCH}'] are not supported" in out, out[-4000:]
    assert "names an architecture this vLLM" in out  # the fix
    assert "Supported architectures" not in out and "a bug: please report it" not in out
    assert not (tmp_path / "sockets" / "unknown").exists()  # refused before the rank's files
