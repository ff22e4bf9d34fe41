"""Every GPU example loads as written: planned from the real config.json of the model it names
(tests/data/models/<name>/config.json, no weights), by the daemon's own planner for the
reference profile, and by vLLM's layout rules (vllm_layout_rules.py) for caches whose engines
are vLLM. An example naming a model without its config here fails: ship the config with it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from header_checkpoints import write_header_checkpoint
from repo_root import ROOT
from vllm_layout_rules import layout_problems
from weightcache.checkpoints.planner import plan_world
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_operator.observe.validation import parse
from weightcache_operator.spec import WeightCache

MODELS = ROOT / "tests" / "data" / "models"
GPU_EXAMPLES = sorted(
    path.name
    for path in (ROOT / "examples").glob("*.yaml")
    if yaml.safe_load(path.read_text())["spec"]["daemon"].get("backend", "cuda-vmm") in GPU_BACKENDS
)


def example(name: str) -> WeightCache:
    body = yaml.safe_load((ROOT / "examples" / name).read_text())
    body["metadata"].update(namespace="default", uid="0000", generation=1)
    cache, problems = parse(body)
    assert cache is not None and problems == [], problems
    return cache


def model_config(cache: WeightCache) -> Path:
    """The shipped config.json of the model an example names (the last part of its path)."""
    source = cache.spec.model.source
    where = source.pvc.sub_path if source.pvc is not None else source.host_path.path if source.host_path else None
    config = MODELS / Path(where or "").name / "config.json"
    assert config.is_file(), f"no real config.json for {where!r}: add it as {config.relative_to(ROOT)}"
    return config


def test_both_profiles_have_a_gpu_example() -> None:
    profiles = {example(name).spec.engine.vllm is not None for name in GPU_EXAMPLES}
    assert profiles == {False, True}, GPU_EXAMPLES


@pytest.mark.parametrize("name", GPU_EXAMPLES)
def test_the_daemon_would_load_every_rank_of_the_gpu_example(name: str, tmp_path: Path) -> None:
    cache = example(name)
    spec = cache.spec
    parallelism = spec.parallelism
    config = model_config(cache)
    if spec.engine.vllm is not None:
        expert_parallel = parallelism.expert > 1
        assert layout_problems(json.loads(config.read_text()), parallelism.tensor, expert_parallel) == []
        return
    world = plan_world(
        str(write_header_checkpoint(config, tmp_path / "model")),
        parallelism.tensor,
        parallelism.pipeline,
        parallelism.expert,
        quantization=spec.model.quantization.method,
        weight_block_size=tuple(spec.model.quantization.weight_block_size),  # type: ignore[arg-type]
        dtype=spec.model.dtype,
    )
    refused = {r.refused for r in world.ranks if r.refused}
    assert world.ok, f"{name}: the daemon refuses {len(refused)} kind(s) of rank: {refused}"
    assert len(world.ranks) == parallelism.ranks


def qwen3_235b() -> dict[str, Any]:
    return dict(json.loads((MODELS / "Qwen3-235B-A22B-FP8" / "config.json").read_text()))


def test_vllm_refuses_the_block_fp8_moe_at_tensor_8_unless_experts_stay_whole() -> None:
    [problem] = layout_problems(qwen3_235b(), 8)
    assert "moe_intermediate_size 1536 / 8 = 192 per rank is not a multiple of the FP8 block 128" in problem
    assert layout_problems(qwen3_235b(), 8, expert_parallel=True) == []
    assert layout_problems(qwen3_235b(), 4) == []


def test_vllm_refuses_heads_the_tensor_parallel_size_does_not_split() -> None:
    assert layout_problems(qwen3_235b(), 3) == [
        "num_attention_heads 64 is not divisible by tensor parallel 3",
        "num_key_value_heads 4 neither divides nor is divided by tensor parallel 3",
    ]
    # Eight KV heads over 16 ranks: each head replicated on two; 128 rows, one whole block each.
    assert layout_problems(qwen3_235b(), 16, expert_parallel=True) == []


def test_vllm_checks_every_sharded_dimension_of_a_dense_block_fp8_model() -> None:
    dense = {
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_size": 4096,
        "intermediate_size": 12288 + 64,
        "num_hidden_layers": 2,
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    assert layout_problems(dense, 2) == [
        "gate_up_proj: output partition 6176 is not a multiple of the FP8 block 128",
        "down_proj: input partition 6176 is not a multiple of the FP8 block 128",
    ]
    assert layout_problems({**dense, "quantization_config": None}, 2) == []
