"""tests/cluster places examples/weightcache-vllm-cpu.yaml's checkpoint as it does the CPU sample's:
a tiny bf16 Qwen3 (head size 64, vLLM's CPU attention) at the example's hostPath under each node
root, in a layout vLLM accepts at the example's parallelism."""

from __future__ import annotations

import json
from pathlib import Path

from testcluster.sample import (
    SAMPLE,
    VLLM_SAMPLE,
    checkpoint_path,
    generate_checkpoint,
    node_labels,
    place_checkpoint,
    sample,
)
from vllm_layout_rules import layout_problems


def test_the_vllm_sample_checkpoint_is_a_tiny_qwen3_placed_on_every_node_root(tmp_path: Path) -> None:
    made = generate_checkpoint(tmp_path / "made", VLLM_SAMPLE)
    roots = [tmp_path / "node-1", tmp_path / "node-2"]
    copies = place_checkpoint(made, roots, VLLM_SAMPLE)
    assert copies == [root / "models" / "tiny-qwen3" for root in roots]
    assert checkpoint_path(VLLM_SAMPLE) == "/models/tiny-qwen3" != checkpoint_path()
    for copy in copies:
        config = json.loads((copy / "config.json").read_text())
        assert config["architectures"] == ["Qwen3ForCausalLM"]
        shape = tuple(config[k] for k in ("hidden_size", "head_dim", "num_attention_heads", "num_key_value_heads"))
        assert shape == (256, 64, 4, 2)
        assert config["dtype"] == sample(VLLM_SAMPLE)["spec"]["model"]["dtype"] == "bfloat16"
        assert sorted(p.name for p in copy.glob("*.safetensors")) and (copy / "tokenizer.json").is_file()
        tensor = int(sample(VLLM_SAMPLE)["spec"]["parallelism"]["tensor"])
        assert layout_problems(config, tensor) == [] and layout_problems(config, 2) == []


def test_both_cpu_examples_select_the_same_test_nodes() -> None:
    assert node_labels(VLLM_SAMPLE) == node_labels(SAMPLE) == {"weightcache.io/test-node": "true"}
