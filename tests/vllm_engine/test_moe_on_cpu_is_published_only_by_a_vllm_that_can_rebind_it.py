"""vLLM's CPU MoE packs its experts into new tensors while it post-processes. A vLLM with the "weights
already processed" mode rebuilds around the packed experts, so its daemon publishes them; a vLLM
without that mode (0.26) would pack the mapped, already packed experts again, so its daemon refuses
the model by method name before it loads a byte, and nothing wrong is ever published."""

from pathlib import Path

from vllm_harness import qwen3_moe_checkpoint, start_daemon, vllm_args
from weightcache.vllm import versions


def test_a_cpu_moe_is_published_only_when_the_engine_could_rebind_it(tmp_path: Path) -> None:
    model = qwen3_moe_checkpoint(tmp_path / "qwen3-moe")
    daemon = start_daemon(model, tmp_path / "sockets", "moe", vllm_args(), logs=tmp_path)
    try:
        if versions.pre_processed_mode():
            daemon.wait_ready()
            assert daemon.files(0).read_ready() is not None
        else:
            assert daemon.proc.wait(timeout=600) != 0
            out = daemon.log.read_text()
            assert "cannot be served from the weight cache by vLLM 0.26" in out, out[-4000:]
            assert "UnquantizedFusedMoEMethod" in out  # the method, by name
            assert "--load-format auto" in out  # the fix
            files = daemon.files(0)
            assert not files.ready.exists() and not files.socket.exists()  # nothing served
    finally:
        daemon.stop()
