"""A fingerprint setting's digest (``engine_profiles.stamp.sha256_of``) over what engines hand it.

SGLang's FP8 quantization section holds the model's own config (``quantization_config["hf_config"]``
is the ``PretrainedConfig`` whose ``to_dict`` contains that section), so a digest that serialises a
config through its ``repr`` recurses into itself and fails, and with it the daemon's fingerprint of
every block-FP8 checkpoint."""

from typing import Any

from transformers import Qwen3MoeConfig
from weightcache.engine_profiles.stamp import sha256_of


def self_referencing(fmt: str = "e4m3") -> Any:
    config = Qwen3MoeConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    config.quantization_config = {"quant_method": "fp8", "fmt": fmt, "weight_block_size": [128, 128]}
    config.quantization_config["hf_config"] = config  # as SGLang's ModelConfig leaves it
    return config


def test_a_config_whose_quantization_section_holds_the_config_itself_has_a_digest() -> None:
    config = self_referencing()
    assert len(sha256_of(config.to_dict())) == 64
    assert len(sha256_of(config.quantization_config)) == 64


def test_the_digest_is_the_same_for_equal_configs_and_differs_when_a_setting_differs() -> None:
    assert sha256_of(self_referencing().to_dict()) == sha256_of(self_referencing().to_dict())
    assert sha256_of(self_referencing().quantization_config) == sha256_of(self_referencing().quantization_config)
    assert sha256_of(self_referencing("e5m2").to_dict()) != sha256_of(self_referencing().to_dict())
    assert sha256_of(self_referencing("e5m2").quantization_config) != sha256_of(self_referencing().quantization_config)


def test_a_nested_config_counts_by_its_settings_not_by_its_repr() -> None:
    inner = Qwen3MoeConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    other = Qwen3MoeConfig(num_hidden_layers=3, hidden_size=64, num_attention_heads=4, num_key_value_heads=2)
    assert sha256_of({"text_config": inner}) == sha256_of({"text_config": inner.to_dict()})
    assert sha256_of({"text_config": inner}) != sha256_of({"text_config": other})
