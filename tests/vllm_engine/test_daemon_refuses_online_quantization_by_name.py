"""An online quantization in the daemon's vLLM arguments (``--quantization fp8``: vLLM quantizes the
weights while it loads them) is refused before a weight is loaded, naming the method: an engine
could not rebuild that method's state from published tensors. Nothing is published and the rank's
files are gone."""

from pathlib import Path

from vllm_harness import qwen3_checkpoint, start_daemon, vllm_args


def test_online_fp8_is_refused_by_name_before_a_weight_is_loaded(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    # A vLLM argument inside --engine-args, not a daemon flag: the refused input is spelled as a user would.
    daemon = start_daemon(model, tmp_path / "sockets", "fp8", [*vllm_args(), "--quantization", "fp8"], logs=tmp_path)
    assert daemon.proc.wait(timeout=600) != 0
    out = daemon.log.read_text()
    assert "quantization 'fp8' cannot be served from the weight cache" in out, out[-4000:]
    assert "Fp8PerTensorOnlineLinearMethod (e.g. layer model.layers.0." in out
    assert "drop --quantization from --engine-args" in out
    assert "Loading safetensors checkpoint shards" not in out  # refused before loading
    assert "a bug: please report it" not in out
    files = daemon.files(0)
    assert not files.socket.exists() and files.read_ready() is None
