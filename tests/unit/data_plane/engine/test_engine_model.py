"""The engine's forward pass against transformers, in one process (TP=1; TP>1 is in integration).

Tolerances. In float32 both implementations run the same operations in the same order except
inside kernels (BLAS blocking, the attention kernel's reductions, our FP8 linear multiplying one
block-row at a time): float32 has a 2^-24 relative rounding step, and accumulating a few hundred
products of O(1) values puts the drift near 1e-5 of the logits' scale, so ``atol=2e-4`` (plus
``rtol=1e-5``) is tight enough that a wrong rotary half, a missed norm, a GQA head mapping off by
one or a transposed FP8 scale — each of which moves logits by O(0.1..10) — cannot pass. bfloat16
is held to transformers' bfloat16 at a realistic width in tests/integration/test_bf16_parity.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from repo_root import ROOT
from weightcache.checkpoints.quantization import dequantize_block_fp8, quantize_block_fp8
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import Weights, expect, load_from_disk
from weightcache.engine.config import ModelConfig
from weightcache.engine.model import Linear, Model
from weightcache.engine.parallel import Group
from weightcache.tools.reference_hf import bound_hf_model, dequantized_hf_model, greedy, oracle_hf_model
from weightcache_contract.errors import BindError, UnsupportedArchitecture

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from hf_parity import engine_greedy  # noqa: E402

PROMPT = [3, 17, 101, 7, 250, 42, 9, 300, 12]
ATOL, RTOL = 2e-4, 1e-5
FP8_SPEC = dict(family="llama", hidden_size=256, intermediate_size=512, num_heads=4, num_kv_heads=2, num_layers=2)
MOE_SPEC = dict(family="qwen3_moe", num_layers=3, num_experts=8, num_experts_per_tok=2)
FP8_MOE_SPEC = dict(
    family="qwen3_moe",
    hidden_size=256,
    num_heads=4,
    num_kv_heads=2,
    num_layers=2,
    num_experts=4,
    moe_intermediate_size=128,
)


def engine_model(
    ckpt: Path, dtype: str, quantization: str = "none", layout: Layout = Layout()
) -> tuple[Model, Weights]:
    weights = load_from_disk(expect(str(ckpt), layout, dtype=dtype, quantization=quantization))
    block = (128, 128) if quantization == "fp8" else None
    group = Group(layout.tp_rank, layout.tp_size)  # sizes the shards; only a forward would communicate
    model = Model(ModelConfig.from_checkpoint(ckpt), weights.tensors, weights.aliases, group, block, layout.ep_size)
    model.keep_alive = weights
    return model, weights


@pytest.mark.parametrize("family, tied", [("llama", False), ("qwen2", True), ("qwen3", False), ("qwen3_moe", False)])
def test_float32_logits_match_transformers(checkpoint_factory, family: str, tied: bool) -> None:
    ckpt = checkpoint_factory(
        **{**(MOE_SPEC if family == "qwen3_moe" else {}), "family": family}, tie_word_embeddings=tied
    )
    model, _ = engine_model(ckpt, "float32")
    oracle = oracle_hf_model(ckpt, "float32")
    with torch.inference_mode():
        want = oracle(torch.tensor([PROMPT])).logits[0].float()
    got = model.forward(torch.tensor(PROMPT), model.new_cache(len(PROMPT)), all_logits=True)
    assert want.abs().max() > 1.0  # the comparison is not between two near-zero tensors
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert engine_greedy(model, PROMPT, 10) == greedy(oracle, PROMPT, 10)


def test_moe_bfloat16_logits_point_the_same_way_as_transformers(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE_SPEC)
    model, _ = engine_model(ckpt, "bfloat16")
    with torch.inference_mode():
        want = oracle_hf_model(ckpt, "bfloat16")(torch.tensor([PROMPT])).logits[0].float()
    got = model.forward(torch.tensor(PROMPT), model.new_cache(len(PROMPT)), all_logits=True)
    assert F.cosine_similarity(got, want, dim=-1).min() > 0.999


def test_decoding_with_the_kv_cache_equals_recomputing_the_whole_sequence(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama")
    model, _ = engine_model(ckpt, "float32")
    full = model.forward(torch.tensor(PROMPT), model.new_cache(len(PROMPT)), all_logits=True)
    cache = model.new_cache(len(PROMPT))
    head = model.forward(torch.tensor(PROMPT[:4]), cache, all_logits=True)  # prefill, then one token at a time
    steps = [model.forward(torch.tensor([t]), cache) for t in PROMPT[4:]]
    torch.testing.assert_close(torch.cat([head, *steps]), full, atol=ATOL, rtol=RTOL)
    assert cache.length == len(PROMPT)


def test_interleaved_requests_keep_their_own_kv_state(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama")
    model, _ = engine_model(ckpt, "float32")
    a, b = [5, 6, 7, 8], [400, 3, 99]
    alone_a, alone_b = engine_greedy(model, a, 6), engine_greedy(model, b, 6)
    ca, cb = model.new_cache(10), model.new_cache(10)
    la, lb = model.forward(torch.tensor(a), ca), model.forward(torch.tensor(b), cb)
    out_a, out_b = [], []
    for _ in range(6):  # alternate steps between the two requests, as the scheduler does
        out_a.append(int(la[-1].argmax()))
        la = model.forward(torch.tensor(out_a[-1:]), ca)
        out_b.append(int(lb[-1].argmax()))
        lb = model.forward(torch.tensor(out_b[-1:]), cb)
    assert (out_a, out_b) == (alone_a, alone_b)


@pytest.mark.parametrize("prequantized", [False, True])
@pytest.mark.parametrize("spec", [FP8_SPEC, FP8_MOE_SPEC], ids=["llama", "qwen3_moe"])
def test_fp8_logits_match_a_dequantized_reference(checkpoint_factory, prequantized: bool, spec: dict) -> None:
    ckpt = checkpoint_factory(**spec, fp8=prequantized)
    model, weights = engine_model(ckpt, "float32", "fp8")
    fp8 = [lin for layer in model.layers for lin in layer.linears()]
    assert fp8 and all(lin.weight.dtype == torch.float8_e4m3fn and lin.scale_inv is not None for lin in fp8)
    experts = [layer.moe for layer in model.layers if layer.moe is not None]
    assert all(
        moe.gate_up.dtype == moe.down.dtype == torch.float8_e4m3fn and moe.down_scale is not None for moe in experts
    ) and len(experts) == (2 if spec is FP8_MOE_SPEC else 0)
    reference = dequantized_hf_model(ckpt, weights, "float32", (128, 128))
    with torch.inference_mode():
        want = reference(torch.tensor([PROMPT])).logits[0]
    got = model.forward(torch.tensor(PROMPT), model.new_cache(len(PROMPT)), all_logits=True)
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    assert engine_greedy(model, PROMPT, 8) == greedy(reference, PROMPT, 8)


@pytest.mark.parametrize("shape", [(256, 384), (200, 300), (64, 130)])
def test_fp8_linear_dequantizes_block_rows_including_ragged_edges(shape: tuple[int, int]) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=gen)
    q, s = quantize_block_fp8(w, (128, 128))
    x = torch.randn(5, shape[1], generator=gen)
    got = Linear("t", q, scale_inv=s, block=(128, 128))(x)
    # Block-rows change only the BLAS blocking of sums of ~300 O(1) float32 products.
    torch.testing.assert_close(got, F.linear(x, dequantize_block_fp8(q, s, (128, 128))), atol=1e-4, rtol=1e-5)
    # And it really is the quantized weight that is used, not something close to the original by luck.
    assert not torch.allclose(got, F.linear(x, w), atol=1e-5)


def test_weights_are_used_in_place_never_copied(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="qwen2", tie_word_embeddings=True)
    model, weights = engine_model(ckpt, "bfloat16")
    ptrs = {name: t.data_ptr() for name, t in weights.tensors.items()}
    seen = set()
    for name, tensor in model.weights():
        target = weights.aliases.get(name, name)
        assert tensor.data_ptr() == ptrs[target], name
        seen.add(target)
    assert seen == set(weights.tensors)  # the check covers every tensor, biases and norms included
    assert model.lm_head.weight.data_ptr() == model.embed.data_ptr()


def test_transformers_binds_the_stacked_experts_without_a_copy(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(**MOE_SPEC)
    weights = load_from_disk(expect(str(ckpt), Layout(), dtype="float32"))
    model = bound_hf_model(ckpt, weights)
    experts = model.model.layers[2].mlp.experts
    assert experts.gate_up_proj.data_ptr() == weights.tensors["model.layers.2.mlp.experts.gate_up_proj"].data_ptr()
    assert experts.down_proj.data_ptr() == weights.tensors["model.layers.2.mlp.experts.down_proj"].data_ptr()
    with torch.inference_mode():
        got = model(torch.tensor([PROMPT])).logits[0]
        want = oracle_hf_model(ckpt, "float32")(torch.tensor([PROMPT])).logits[0]
    assert torch.equal(got, want)  # transformers' own loader stacks the experts the same way


@pytest.mark.parametrize("spec", [MOE_SPEC, {**FP8_MOE_SPEC, "fp8": True}], ids=["bf16", "fp8"])
def test_the_moe_block_in_bfloat16_is_transformers_bit_for_bit(checkpoint_factory, spec: dict) -> None:
    # Same input, same routes, same bytes out: routing, expert matmuls, weighting and the float32
    # sum over the top-k follow transformers' default (grouped_mm) experts path exactly.
    ckpt = checkpoint_factory(**spec)
    quantization = "fp8" if spec.get("fp8") else "none"
    model, weights = engine_model(ckpt, "bfloat16", quantization)
    reference = dequantized_hf_model(ckpt, weights, "bfloat16", (128, 128))
    hidden = model.cfg.hidden_size
    h = torch.randn(16, hidden, generator=torch.Generator().manual_seed(0)).bfloat16()
    for layer in (0, 1):
        with torch.inference_mode():
            ours, theirs = model.layers[layer].moe(h), reference.model.layers[layer].mlp(h[None])[0]
            (weights_ours, ids_ours), (_, weights_theirs, ids_theirs) = (
                model.layers[layer].moe.route(h),
                reference.model.layers[layer].mlp.gate(h),
            )
        assert torch.equal(ids_ours, ids_theirs) and torch.equal(weights_ours, weights_theirs)
        assert torch.equal(ours, theirs) and theirs.abs().max() > 0.1


@pytest.mark.parametrize(
    "layout", [Layout(2, 0), Layout(2, 1), Layout(2, 1, ep_size=2)], ids=["tp-rank0", "tp-rank1", "ep-rank1"]
)
def test_one_ranks_moe_output_is_its_share_of_the_whole(checkpoint_factory, layout: Layout) -> None:
    # The ranks' partial MoE outputs add up to TP=1's (what the all-reduce relies on); checked here
    # layer by layer on one process, the full TP/EP forward against transformers runs in integration.
    ckpt = checkpoint_factory(**MOE_SPEC)
    whole, _ = engine_model(ckpt, "float32")
    h = torch.randn(5, 128, generator=torch.Generator().manual_seed(1))
    parts = []
    for rank in range(2):
        part, _ = engine_model(ckpt, "float32", layout=Layout(2, rank, ep_size=layout.ep_size))
        parts.append(part.layers[1].moe(h))
    torch.testing.assert_close(parts[0] + parts[1], whole.layers[1].moe(h), atol=ATOL, rtol=RTOL)
    assert not torch.allclose(parts[layout.tp_rank], whole.layers[1].moe(h), atol=1e-2)


def test_weights_that_do_not_fit_the_model_are_refused_by_name(checkpoint_factory) -> None:
    ckpt = checkpoint_factory(family="llama")
    weights = load_from_disk(expect(str(ckpt), Layout(), dtype="float32"))
    cfg = ModelConfig.from_checkpoint(ckpt)
    missing = {k: v for k, v in weights.tensors.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(BindError, match="model.layers.1.mlp.up_proj.weight"):
        Model(cfg, missing, {}, Group())
    extra = {**weights.tensors, "model.layers.9.mlp.up_proj.weight": weights.tensors["model.norm.weight"]}
    with pytest.raises(BindError, match="no place"):
        Model(cfg, extra, {}, Group())


def test_unimplemented_model_features_are_refused(checkpoint_factory) -> None:
    import json

    base = json.loads((checkpoint_factory(family="llama") / "config.json").read_text())
    ModelConfig.from_dict(base)
    for change, words in [
        ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, "llama3"),
        ({"hidden_act": "gelu"}, "gelu"),
        ({"architectures": ["MistralForCausalLM"]}, "Mistral"),
    ]:
        with pytest.raises(UnsupportedArchitecture, match=words):
            ModelConfig.from_dict({**base, **change})


@pytest.mark.parametrize("n, past", [(12, 0), (1, 11), (4, 8)])  # prefill, decode, prefill after earlier tokens
def test_attention_is_transformers_sdpa_bit_for_bit_in_bf16(n: int, past: int) -> None:
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from weightcache.engine.model import sdpa

    gen = torch.Generator().manual_seed(0)
    heads, kv, d = 8, 2, 128
    q = torch.randn(heads, n, d, generator=gen).bfloat16()
    keys = torch.randn(kv, past + n, d, generator=gen).bfloat16()
    values = torch.randn(kv, past + n, d, generator=gen).bfloat16()
    mask = None  # what transformers' create_causal_mask gives sdpa without padding, except after earlier tokens
    if n > 1 and past:
        mask = torch.ones(n, past + n, dtype=torch.bool).tril(diagonal=past)[None, None]
    module = SimpleNamespace(num_key_value_groups=heads // kv, is_causal=True)
    want, _ = sdpa_attention_forward(module, q[None], keys[None], values[None], mask, scaling=d**-0.5)
    got = sdpa(q, keys, values, past, heads // kv, d**-0.5)
    assert torch.equal(got.transpose(0, 1), want[0])


def test_moe_configs_are_read_and_their_parallel_layouts_checked(checkpoint_factory) -> None:
    import json

    from weightcache_contract.errors import ShardingError

    config = json.loads((checkpoint_factory(**MOE_SPEC) / "config.json").read_text())
    cfg = ModelConfig.from_dict(config)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob, cfg.qk_norm) == (
        8,
        2,
        128,
        True,
        True,
    )  # transformers writes num_experts as num_local_experts
    cfg.check_tensor_parallel(4, 4)
    cfg.check_tensor_parallel(4, 2)
    for tp, ep, words in [
        (4, 8, "--ep-size 8 must divide --tp-size 4"),
        (3, 1, "num_attention_heads=.* is not divisible by tensor-parallel size 3"),
    ]:
        with pytest.raises(ShardingError, match=words):
            cfg.check_tensor_parallel(tp, ep)
    with pytest.raises(
        ShardingError, match="moe_intermediate_size=97 is not divisible by tensor-parallel .tp/ep. size 2"
    ):
        ModelConfig.from_dict({**config, "moe_intermediate_size": 97, "num_key_value_heads": 8}).check_tensor_parallel(
            4, 2
        )
    with pytest.raises(ShardingError, match="num_experts=6 is not divisible by expert-parallel size 4"):
        ModelConfig.from_dict({**config, "num_local_experts": 6}).check_tensor_parallel(4, 4)
    with pytest.raises(UnsupportedArchitecture, match="mixing dense and MoE layers"):
        ModelConfig.from_dict({**config, "decoder_sparse_step": 2})
    dense = ModelConfig.from_dict(json.loads((checkpoint_factory(family="qwen3") / "config.json").read_text()))
    with pytest.raises(ShardingError, match="--ep-size 2 needs a mixture-of-experts model"):
        dense.check_tensor_parallel(2, 2)
