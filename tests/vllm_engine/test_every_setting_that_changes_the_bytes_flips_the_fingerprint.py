"""The daemon and the engine compute the rank's fingerprint from the VllmConfig each builds from the
same vLLM arguments; any argument or checkpoint change that changes what vLLM's loader and
post-processing write makes them differ, naming the field (what the loader's fallback logs or its
error names). vLLM's config only: no weights are loaded, no engine starts."""

import json
from pathlib import Path

import pytest
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm_harness import qwen3_checkpoint, qwen3_moe_checkpoint, vllm_args
from weightcache.vllm.stamp import rank_fingerprint
from weightcache.wire.fingerprint import Fingerprint


def fingerprint(model: Path, args: list[str], tp_rank: int = 0) -> Fingerprint:
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    config = EngineArgs.from_cli_args(parser.parse_args(["--model", str(model), *args])).create_engine_config()
    return rank_fingerprint(config, tp_rank)


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen3_checkpoint(tmp_path_factory.mktemp("dense") / "qwen3")


def test_the_same_arguments_give_the_same_fingerprint(dense: Path) -> None:
    assert fingerprint(dense, vllm_args()).digest == fingerprint(dense, vllm_args()).digest


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--dtype", "float32"], "dtype"),
        (["--hf-overrides", json.dumps({"rms_norm_eps": 1e-5})], "engine.settings.hf_config_sha256"),
        (["--revision", "seed-1"], "revision"),
        (["--kv-cache-dtype", "fp8"], "engine.settings.kv_cache_dtype"),
        (["--load-format", "dummy"], "engine.settings.load_format"),
        (["--model-impl", "transformers"], "engine.settings.model_class"),
        (["--convert", "embed"], "engine.settings.convert"),
        (["--trust-remote-code"], "engine.settings.trust_remote_code"),
        (["--code-revision", "other"], "engine.settings.code_revision"),
        (["--linear-backend", "torch"], "engine.settings.linear_backend"),
        (["--moe-backend", "triton"], "engine.settings.moe_backend"),
        (["--quantization-config", json.dumps({"linear": "fp8_per_block"})],
         "engine.settings.online_quantization_config_sha256"),
    ],
)  # fmt: skip
def test_a_vllm_argument_that_changes_the_bytes_flips_the_fingerprint_naming_it(
    dense: Path, extra: list[str], field: str
) -> None:
    base = fingerprint(dense, vllm_args())
    changed = fingerprint(dense, [*vllm_args(), *extra])
    assert changed.digest != base.digest
    assert field in base.differences(changed)


def test_the_tensor_parallel_layout_and_rank_flip_the_fingerprint(dense: Path) -> None:
    one = fingerprint(dense, vllm_args(tp=1))
    rank0, rank1 = fingerprint(dense, vllm_args(tp=2), 0), fingerprint(dense, vllm_args(tp=2), 1)
    assert "tp_size" in one.differences(rank0)
    assert rank0.differences(rank1) == ["tp_rank"]


def test_expert_parallelism_flips_the_fingerprint_of_a_moe_model(tmp_path: Path) -> None:
    moe = qwen3_moe_checkpoint(tmp_path / "moe")
    base = fingerprint(moe, vllm_args(tp=2))
    expert = fingerprint(moe, [*vllm_args(tp=2), "--enable-expert-parallel"])
    assert "engine.settings.enable_expert_parallel" in base.differences(expert)
    placed = fingerprint(
        moe, [*vllm_args(tp=2), "--enable-expert-parallel", "--expert-placement-strategy", "round_robin"]
    )
    assert expert.differences(placed) == ["engine.settings.expert_placement_strategy"]


def test_a_changed_config_or_a_rewritten_shard_flips_the_fingerprint(tmp_path: Path) -> None:
    model = qwen3_checkpoint(tmp_path / "qwen3")
    base = fingerprint(model, vllm_args())
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 1e-5}))
    edited = fingerprint(model, vllm_args())
    assert {"config_sha256", "engine.settings.hf_config_sha256"} <= set(base.differences(edited))
    # A shard replaced in place (here with the same bytes): a new file as far as the stamps can tell.
    shard = sorted(model.glob("*.safetensors"))[0]
    data = shard.read_bytes()
    shard.unlink()
    shard.write_bytes(data)
    assert edited.differences(fingerprint(model, vllm_args())) == ["shards"]


def test_two_dummy_loads_with_other_seeds_differ_in_the_seed(dense: Path) -> None:
    one = fingerprint(dense, [*vllm_args(), "--load-format", "dummy"])
    other = fingerprint(dense, [*vllm_args(), "--load-format", "dummy", "--seed", "1"])
    assert one.differences(other) == ["engine.settings.seed"]


def test_the_engines_weightcache_load_format_agrees_with_the_daemons_checkpoint_load_format(dense: Path) -> None:
    """The engine gets the daemon's list followed by the weightcache loader and its options; its
    fingerprint is that of the disk load it stands for (auto), a dummy one's is not."""
    engine = [*vllm_args(), "--load-format", "weightcache", "--model-loader-extra-config", json.dumps({"name": "q"})]
    assert fingerprint(dense, engine).digest == fingerprint(dense, vllm_args()).digest
    dummy = fingerprint(dense, [*vllm_args(), "--load-format", "dummy"])
    assert "engine.settings.load_format" in dummy.differences(fingerprint(dense, engine))


def without_dtype(args: list[str]) -> list[str]:
    i = args.index("--dtype")
    return args[:i] + args[i + 2 :]


@pytest.mark.parametrize(
    "one, other",
    [
        (["--dtype", "half"], ["--dtype", "float16"]),
        (["--dtype", "bfloat16"], ["--dtype=bfloat16"]),
        (["--dtype", "bfloat16"], ["--dtype", "auto"]),  # the checkpoint's torch_dtype
        (["--dtype", "bfloat16"], ["--dtype", "bfloat16", "--load-format", "safetensors"]),
        (["--dtype", "bfloat16"], ["--dtype", "bfloat16", "--load_format=HF"]),
        (["--dtype", "bfloat16", "--quantization", "fp8"], ["--dtype", "bfloat16", "-q", "FP8"]),
    ],
)
def test_spellings_vllm_parses_to_the_same_config_give_one_fingerprint(
    dense: Path, one: list[str], other: list[str]
) -> None:
    base = without_dtype(vllm_args())
    assert fingerprint(dense, [*base, *one]).digest == fingerprint(dense, [*base, *other]).digest
