"""The rules vLLM (0.32) applies to a model's parallel layout, from config.json alone: what a
``vllm``-profile daemon (which loads with vLLM's own code) would refuse before reading a weight.

Why a copy of vLLM's checks: the unit tests run without vLLM installed, and these few rules are
what decides whether a GPU example can load at all. Each cites the vLLM code it mirrors:

- ``ModelConfig.verify_with_parallel_config`` (vllm/config/model.py): the attention heads must
  divide by tensor parallel; expert parallelism needs a model with experts.
- ``QKVParallelLinear.__init__`` (vllm/model_executor/layers/linear.py): ``divide(tp, kv_heads)``
  when there are fewer KV heads than ranks (each head replicated), ``divide(kv_heads, tp)`` else.
- ``validate_fp8_block_shape`` (vllm/model_executor/layers/quantization/utils/fp8_utils.py), for
  block-FP8 linear layers: every output partition of a column-parallel or merged layer a multiple
  of ``block_n``, the input partition of a row-parallel one a multiple of ``block_k``.
- ``validate_fp8_block_shape_moe`` (same file, called by ``Fp8MoEMethod.create_weights``): each
  rank's expert width (``moe_intermediate_size / tp``, or whole with expert parallelism, where
  ``FusedMoEParallelConfig.make`` sets the MoE tensor-parallel size to 1) a multiple of
  ``block_n``, and of ``block_k`` when tp > 1.
"""

from __future__ import annotations

from typing import Any


def layout_problems(config: dict[str, Any], tp: int, expert_parallel: bool = False) -> list[str]:
    """Why vLLM would refuse ``config`` at this layout; empty when it would load."""
    found: list[str] = []
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    experts = int(config.get("num_experts") or config.get("n_routed_experts") or config.get("num_local_experts") or 0)
    if heads % tp:
        found.append(f"num_attention_heads {heads} is not divisible by tensor parallel {tp}")
    if (tp % kv_heads) if tp >= kv_heads else (kv_heads % tp):
        found.append(f"num_key_value_heads {kv_heads} neither divides nor is divided by tensor parallel {tp}")
    if expert_parallel and not experts:
        found.append("expert parallelism needs a model with experts")
    if found:
        return found

    quantization = config.get("quantization_config") or {}
    block = quantization.get("weight_block_size") if quantization.get("quant_method") == "fp8" else None
    if not block:
        return found
    block_n, block_k = int(block[0]), int(block[1])

    def column(what: str, size: int) -> None:
        if size % block_n:
            found.append(f"{what}: output partition {size} is not a multiple of the FP8 block {block_n}")

    def row(what: str, size: int) -> None:
        if tp > 1 and size % block_k:
            found.append(f"{what}: input partition {size} is not a multiple of the FP8 block {block_k}")

    column("qkv_proj (q)", heads // tp * head_dim)
    column("qkv_proj (k, v)", max(1, kv_heads // tp) * head_dim)
    row("o_proj", heads // tp * head_dim)
    if _has_dense_layers(config, experts):
        intermediate = int(config["intermediate_size"])
        if intermediate % tp:
            found.append(f"intermediate_size {intermediate} is not divisible by tensor parallel {tp}")
        else:
            column("gate_up_proj", intermediate // tp)
            row("down_proj", intermediate // tp)
    if experts:
        width = int(config["moe_intermediate_size"])
        moe_tp = 1 if expert_parallel else tp
        if width % moe_tp:
            found.append(f"moe_intermediate_size {width} is not divisible by tensor parallel {moe_tp}")
            return found
        part = width // moe_tp
        if part % block_n or (tp > 1 and part % block_k):
            found.append(
                f"experts: moe_intermediate_size {width} / {moe_tp} = {part} per rank is not a multiple of the FP8 "
                f"block {block_n}; use a tensor parallel size that keeps whole blocks, or expert parallelism"
            )
    return found


def _has_dense_layers(config: dict[str, Any], experts: int) -> bool:
    """Whether any decoder layer has a plain MLP (Qwen3-MoE's ``mlp_only_layers`` and
    ``decoder_sparse_step``; DeepSeek's ``first_k_dense_replace``); all of them without experts."""
    if not experts:
        return True
    layers = int(config["num_hidden_layers"])
    if int(config.get("first_k_dense_replace") or 0) > 0:
        return True
    step = int(config.get("decoder_sparse_step") or 1)
    only = set(config.get("mlp_only_layers") or [])
    return any(i in only or (i + 1) % step for i in range(layers))
