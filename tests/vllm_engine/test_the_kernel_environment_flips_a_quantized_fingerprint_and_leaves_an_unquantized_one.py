"""vLLM chooses the kernels a quantized model's weights are post-processed for from its environment
(with DeepGEMM block-FP8 weights are requantised to UE8M0 scales, without it CUTLASS and Triton take
them as loaded), so the daemon's and the engine's fingerprints differ when their kernel environment
does, naming the variable and the fix; an unquantized model's fingerprint ignores it. vLLM's config
and environment parsing only: no weights are loaded, no engine starts."""

from pathlib import Path

import pytest
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_harness import qwen3_checkpoint, vllm_args
from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint
from weightcache.vllm.stamp import rank_fingerprint
from weightcache.wire.fingerprint import Fingerprint, mismatch_fix
from weightcache_contract.launch import VLLM_REPLAY_KERNEL_ENV


def fingerprint(model: Path) -> Fingerprint:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    config = EngineArgs.from_cli_args(parser.parse_args(["--model", str(model), *vllm_args()])).create_engine_config()
    return rank_fingerprint(config, 0)


def test_the_pinned_kernel_environment_flips_a_block_fp8_fingerprint_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fp8 = write_checkpoint(
        tmp_path / "fp8",
        ModelSpec(family="qwen3", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, fp8=True),
    )
    for name in VLLM_REPLAY_KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    default = fingerprint(fp8)
    assert default.engine is not None and default.engine.settings["quantization"] == "fp8"
    for name, value in VLLM_REPLAY_KERNEL_ENV.items():
        monkeypatch.setenv(name, value)
    pinned = fingerprint(fp8)
    assert default.differences(pinned) == [
        "engine.settings.env.VLLM_USE_DEEP_GEMM",
        "engine.settings.env.VLLM_USE_DEEP_GEMM.set",
    ]
    fix = mismatch_fix(default.differences(pinned))
    assert fix.startswith("give the daemon and the engine the same value of the environment variable")
    assert pinned.digest == fingerprint(fp8).digest
    # Decided from vLLM's parse of the variable, not its spelling: "00" is the same choice as "0".
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "00")
    assert fingerprint(fp8).digest == pinned.digest


def test_an_unquantized_fingerprint_ignores_the_kernel_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dense = qwen3_checkpoint(tmp_path / "dense")
    monkeypatch.delenv("VLLM_USE_DEEP_GEMM", raising=False)
    default = fingerprint(dense)
    monkeypatch.setenv("VLLM_USE_DEEP_GEMM", "0")
    assert fingerprint(dense).digest == default.digest
