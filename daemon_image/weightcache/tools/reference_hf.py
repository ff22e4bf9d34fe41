"""A Hugging Face transformers model fed by weightcache: the oracle and the demo's engine.

transformers is used here only as a reference implementation of the model families: the same
checkpoint either goes through ``from_pretrained`` (the oracle), through our disk loader, or is
mapped from a daemon and bound with zero copies. Identical logits across the three prove the
cache serves exactly the checkpoint's weights.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..checkpoints import dtypes
from ..client.binding import bind, empty_model
from ..client.weights import Weights


def empty_hf_model(model_dir: str | Path, dtype: str) -> torch.nn.Module:
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(model_dir))
    with empty_model():
        model: torch.nn.Module = transformers.AutoModelForCausalLM.from_config(config, dtype=dtypes.to_torch(dtype))
    return model.eval()


def bound_hf_model(model_dir: str | Path, weights: Weights) -> torch.nn.Module:
    model = empty_hf_model(model_dir, weights.fingerprint.dtype)
    bind_on_device(model, weights)
    return model


def bind_on_device(model: torch.nn.Module, weights: Weights) -> None:
    """Bind ``weights`` into ``model`` and bring what they do not cover to their device."""
    bind(model, weights.tensors, weights.aliases)
    device = next(iter(weights.tensors.values())).device
    # Parameters are on the arena's device now; computed buffers (rotary tables) were made on the
    # CPU by the skeleton. Only those move, not a walk of ``model.to`` over every parameter.
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is not None and buffer.device != device:
                module._buffers[name] = buffer.to(device)


def dequantized_hf_model(
    model_dir: str | Path, weights: Weights, dtype: str, block: tuple[int, int]
) -> torch.nn.Module:
    """transformers' model bound to block-FP8 weights dequantized in full (a copy, in ``dtype``):
    the oracle for FP8 weights, which transformers has no block-FP8 kernel of its own to run. The
    other tensors are cast to ``dtype`` too (shared, not copied, when they already are)."""
    from ..checkpoints.quantization import SCALE_SUFFIX, dequantize_block_fp8

    tensors = {}
    for name, tensor in weights.tensors.items():
        if name.endswith(SCALE_SUFFIX):
            continue
        if tensor.dtype == torch.float8_e4m3fn:
            tensor = dequantize_block_fp8(tensor, weights.tensors[name + SCALE_SUFFIX], block, dtypes.to_torch(dtype))
        tensors[name] = tensor.to(dtypes.to_torch(dtype))
    model = empty_hf_model(model_dir, dtype)
    bind(model, tensors, weights.aliases)
    return model.to(next(iter(tensors.values())).device)


def oracle_hf_model(model_dir: str | Path, dtype: str) -> torch.nn.Module:
    """transformers' own loading path, independent of weightcache."""
    import transformers

    model: torch.nn.Module = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=dtypes.to_torch(dtype)
    )
    return model.eval()


def tokenizer_for(model_dir: str | Path) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


@torch.inference_mode()
def greedy(model: torch.nn.Module, input_ids: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding with the model's KV cache, on the device its weights are on."""
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([input_ids], device=device), use_cache=True)
    generated = []
    for _ in range(max_new_tokens):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        out = model(input_ids=torch.tensor([[token]], device=device), use_cache=True, **_next_cache(out))
    return generated


def _next_cache(out: Any) -> dict[str, Any]:
    """The model output's KV cache as the next call's keyword: ``cache`` in transformers 5.24 (the GPU
    machine's), ``past_key_values`` in 5.19 (vLLM 0.32 requires <5.20)."""
    if hasattr(out, "cache"):
        return {"cache": out.cache}
    return {"past_key_values": out.past_key_values}


def generate_report(
    model_dir: str, load: Callable[[], Weights], dtype: str, prompt: str, max_new_tokens: int, started: float
) -> dict[str, Any]:
    """Build the skeleton, then time weights (load or map) + bind separately, then generate."""
    build_started = time.perf_counter()
    model = empty_hf_model(model_dir, dtype)
    tokenizer = tokenizer_for(model_dir)
    load_started = time.perf_counter()
    weights = load()
    bind_started = time.perf_counter()
    bind_on_device(model, weights)
    bound = time.perf_counter()
    tokens = greedy(model, tokenizer.encode(prompt), max_new_tokens)
    return {
        **weights.report(),
        "build_seconds": round(load_started - build_started, 6),
        "bind_seconds": round(bound - bind_started, 6),
        "weights_ready_seconds": round(bound - load_started, 6),
        "process_seconds": round(time.perf_counter() - started, 3),
        "completion": tokenizer.decode(tokens),
        "tokens": tokens,
    }


def dump(report: dict[str, Any]) -> str:
    return json.dumps(report, sort_keys=True)
