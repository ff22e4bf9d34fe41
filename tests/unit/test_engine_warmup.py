"""The GPU kernel warm-up beside the start (engine/warmup.py): nothing on CPU, the right shapes.

On a GPU the warm-up thread swallows its errors (the real warm-up reports them by name), so a
shape mistake there would only cost speed, silently; here its forward runs on CPU at real per-rank
shapes, dense and MoE, GQA and qk-norm, tensor-parallel or not. Tokens are checked end to end by
the engine tests, which now start with this module on the path.
"""

import subprocess
import sys
import threading

import pytest
import torch
from weightcache.engine import warmup
from weightcache.engine.config import ModelConfig

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
}
LLAMA = {**QWEN3, "architectures": ["LlamaForCausalLM"], "num_key_value_heads": 8, "head_dim": None}


def test_start_does_nothing_on_cpu() -> None:
    before = threading.active_count()
    assert warmup.start(ModelConfig.from_dict(QWEN3), 1, "bfloat16", "cpu") is None
    assert threading.active_count() == before
    assert not any(t.name == "warm-kernels" for t in threading.enumerate())


@pytest.mark.parametrize("config", [QWEN3, LLAMA], ids=["qwen3-gqa-qknorm", "llama-mha"])
@pytest.mark.parametrize("tp_size", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_forward_runs_at_per_rank_shapes(config: dict, tp_size: int, dtype: torch.dtype) -> None:
    token = warmup.run(ModelConfig.from_dict(config), tp_size, dtype, "cpu")
    assert token.dtype == torch.int64 and 0 <= int(token) < config["vocab_size"]


def test_moe_shapes() -> None:
    moe = {**QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2}
    warmup.run(ModelConfig.from_dict({**moe, "moe_intermediate_size": 32}), 2, torch.bfloat16, "cpu")


def test_it_imports_torch_and_nothing_of_the_engine() -> None:
    """The thread starts right after ``import torch``, before the engine's other modules load."""
    probe = (
        "import sys, weightcache.engine.warmup; "
        "print(sorted(m for m in sys.modules if m.startswith(('weightcache.engine.', 'aiohttp'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "['weightcache.engine.warmup']"
