"""Plain weights on CPU: what keeps a mapped arena usable without copies.

vLLM's CPU post-processing replaces each linear layer's weight by a oneDNN / sgl-kernel handle
that holds its own reordered copy (and empties ``layer.weight``), and packs a copy of every
unquantized embedding and lm_head beside the plain weight. A copy per engine is exactly what the
cache exists to avoid, and a packed copy cannot live in a shared arena (it is an opaque handle,
not a tensor). So both the publisher and the engine mark layers to keep their plain ``[out, in]``
weights and use ``torch.nn.functional.linear`` — the path vLLM itself uses for MLA's
``kv_b_proj``. The trade-off: plain GEMMs instead of oneDNN's prepacked ones (slower prefill; in
bf16 on CPUs with AVX-512 BF16 or AMX, rounded otherwise than vLLM's default: docs/vllm.md).

The marking is a subclass of vLLM's method swapped into each layer, not vLLM's
``_cpu_skip_gemm_dispatch`` flag: every supported vLLM calls ``layer.cpu_linear`` for an
unquantized linear on CPU, but only the newer ones read the flag.

The policy is part of the fingerprint (``settings["cpu_gemm"]``): arenas published under it
hold plain weights where vLLM's default would hold none.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

POLICY = "plain-f-linear"


class PlainLinearMethod(UnquantizedLinearMethod):
    """UnquantizedLinearMethod that keeps the plain weight and computes with ``F.linear`` on CPU."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]


class PlainEmbeddingMethod(UnquantizedEmbeddingMethod):
    """UnquantizedEmbeddingMethod without the packed copy it makes on CPU (it has no flag for that)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        layer.cpu_linear = torch.nn.functional.linear  # type: ignore[assignment]


def keep_plain_weights(model: nn.Module) -> int:
    """Mark every unquantized linear and embedding layer of ``model``; returns how many.

    Call after the model is built and before ``process_weights_after_loading``. Quantized
    layers are left alone: their methods decide what they keep (docs/vllm.md)."""
    marked = 0
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        plain = {UnquantizedLinearMethod: PlainLinearMethod, UnquantizedEmbeddingMethod: PlainEmbeddingMethod}.get(
            type(method)  # exact types: a subclass (a quantized method's base) keeps its own
        )
        if plain is not None:
            swapped = plain.__new__(plain)
            swapped.__dict__.update(vars(method))
            module.quant_method = swapped  # type: ignore[assignment]
            marked += 1
    return marked
