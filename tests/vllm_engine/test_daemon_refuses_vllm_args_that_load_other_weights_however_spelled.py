"""``--engine-args`` that would make the daemon load other weights than the checkpoint's (vLLM's dummy
weights, another loader, another model, loader options, a quantization the cache does not serve)
are refused from what vLLM's own parser makes of the list, however it is spelled: a flag, its
underscore form, a unique prefix, ``--flag=value``, dotted JSON keys, a ``--config`` YAML file. The
engine gets the same list followed by ``--load-format weightcache``, so it would map those bytes as
the real ones. vLLM's parser and config only: nothing is loaded, no engine starts."""

import json
from pathlib import Path

import pytest
from vllm_harness import qwen3_checkpoint, vllm_args
from weightcache.vllm.engine_args import engine_config
from weightcache_contract.errors import WeightCacheError


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return qwen3_checkpoint(tmp_path_factory.mktemp("args") / "qwen3")


def yaml_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "vllm.yaml"
    path.write_text(text)
    return str(path)


def refusal(model: Path, extra: list[str]) -> str:
    with pytest.raises(WeightCacheError) as refused:
        engine_config(str(model), [*vllm_args(), *extra], 1, 1)
    return str(refused.value)


DUMMY = "--engine-args make vLLM load with load_format='dummy' (however it is spelled"


@pytest.mark.parametrize(
    "extra",
    [
        ["--load-format", "dummy"],
        ["--load_format", "dummy"],
        ["--load-form", "dummy"],
        ["--load", "dummy"],
        ["--load-format=dummy"],
        ["--load_format=DUMMY"],
        ["--load-format", "auto", "--load-format", "dummy"],  # the last one wins
    ],
)
def test_a_dummy_load_format_is_refused_however_the_flag_is_spelled(model: Path, extra: list[str]) -> None:
    assert DUMMY in refusal(model, extra)


@pytest.mark.parametrize("yaml", ["load-format: dummy\n", "load_format: dummy\n", "load-format: DUMMY\n"])
def test_a_dummy_load_format_from_a_config_file_is_refused(model: Path, tmp_path: Path, yaml: str) -> None:
    assert DUMMY in refusal(model, ["--config", yaml_file(tmp_path, yaml)])


@pytest.mark.parametrize(
    "load_format",
    ["weightcache", "ipc_cache", "runai_streamer", "sharded_state", "tensorizer", "pt", "npcache", "mistral",
     "fastsafetensors", "instanttensor", "modelexpress", "no-such-format"],
)  # fmt: skip
def test_every_load_format_that_does_not_read_the_checkpoint_as_auto_does_is_refused_by_name(
    model: Path, load_format: str
) -> None:
    message = refusal(model, ["--load-format", load_format])
    assert f"load_format={load_format!r}" in message
    assert "remove it from --engine-args" in message


def test_a_dotted_load_format_key_is_refused_with_the_value_vllm_parsed(model: Path) -> None:
    """``--load-format.x v`` is vLLM's JSON-key syntax: the load format becomes a JSON string."""
    assert """load_format='{"format": "dummy"}'""" in refusal(model, ["--load.format", "dummy"])


@pytest.mark.parametrize(
    "extra",
    [
        ["--model", "/models/other"],
        ["--model=/models/other"],
    ],
)
def test_a_model_in_the_list_is_refused_naming_it(model: Path, extra: list[str]) -> None:
    assert "--engine-args set vLLM's model to '/models/other'" in refusal(model, extra)


def test_a_model_in_a_config_file_is_refused_naming_it(model: Path, tmp_path: Path) -> None:
    message = refusal(model, ["--config", yaml_file(tmp_path, "model: /models/other\n")])
    assert "--engine-args set vLLM's model to '/models/other'" in message
    assert f"the model is the daemon's --model {model}" in message


def test_the_daemons_own_model_in_the_list_is_refused_too(model: Path) -> None:
    """``vllm serve MODEL ... --model MODEL`` moves the flag's value in front of the positional one
    and fails on the extra argument: the engine would not start."""
    assert f"model to {str(model)!r}" in refusal(model, ["--model", str(model)])


EXTRA = "--engine-args give vLLM's loader model_loader_extra_config={'enable_multithread_load': True}"


@pytest.mark.parametrize(
    "extra",
    [
        ["--model-loader-extra-config", '{"enable_multithread_load": true}'],
        ["--model_loader_extra_config", '{"enable_multithread_load": true}'],
        ["--model-loader", '{"enable_multithread_load": true}'],
        ["--model-loader-extra-config.enable_multithread_load", "true"],
        ['--model-loader-extra-config={"enable_multithread_load": true}'],
    ],
)
def test_loader_options_are_refused_however_spelled(model: Path, extra: list[str]) -> None:
    assert EXTRA in refusal(model, extra)


def test_loader_options_from_a_config_file_are_refused(model: Path, tmp_path: Path) -> None:
    yaml = "model-loader-extra-config:\n  enable_multithread_load: true\n"
    assert EXTRA in refusal(model, ["--config", yaml_file(tmp_path, yaml)])


@pytest.mark.parametrize(
    "extra, method",
    [
        (["--quantization", "awq"], "awq"),
        (["-q", "gptq"], "gptq"),
        (["--quantization=AWQ"], "awq"),
        (["--quantization", "fp8_per_block"], "fp8_per_block"),
        (["--quantization", "online"], "online"),
        (["--hf-overrides", json.dumps({"quantization_config": {"quant_method": "compressed-tensors"}})],
         "compressed-tensors"),
    ],
)  # fmt: skip
def test_a_quantization_outside_the_allowlist_is_refused_however_spelled(
    model: Path, extra: list[str], method: str
) -> None:
    message = refusal(model, extra)
    assert f"vLLM would quantize with quantization={method!r}" in message
    assert "(allowed: none, fp8)" in message


def test_a_quantization_from_a_config_file_is_refused(model: Path, tmp_path: Path) -> None:
    assert "quantization='awq'" in refusal(model, ["--config", yaml_file(tmp_path, "quantization: awq\n")])


def test_online_quantization_by_its_config_is_refused(model: Path) -> None:
    message = refusal(model, ["--quantization-config", json.dumps({"linear": "fp8_per_block"})])
    assert "--engine-args ask vLLM to quantize while loading with quantization_config=" in message


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["--load-format", "auto"],
        ["--load_format=safetensors"],
        ["--load-format", "HF"],
        ["--model-loader-extra-config", "{}"],
        ["-q", "FP8"],
    ],
)
def test_what_reads_the_checkpoint_as_the_engines_disk_fallback_does_is_accepted(model: Path, extra: list[str]) -> None:
    engine_config(str(model), [*vllm_args(), *extra], 1, 1)


@pytest.mark.parametrize(
    "yaml, extra, reason",
    [
        (None, ["--config", "/nonexistent/vllm.yaml"], "FileNotFoundError"),
        (None, ["--config", "vllm.json"], "Config file must be of a yaml/yml type"),
        ("- load-format\n- dummy\n", [], "AttributeError"),
        ("dtype: bfloat16\n", ["--config", "{yaml}"], "More than one config file specified"),
    ],
)
def test_a_config_file_vllms_parser_cannot_read_is_refused_with_its_reason(
    model: Path, tmp_path: Path, yaml: str | None, extra: list[str], reason: str
) -> None:
    given = ["--config", yaml_file(tmp_path, yaml)] if yaml is not None else []
    message = refusal(model, [*given, *(a.format(yaml=given[1] if given else "") for a in extra)])
    assert "vLLM's engine-argument parser could not read --engine-args" in message and reason in message
