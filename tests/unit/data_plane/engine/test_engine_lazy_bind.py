"""The reference engine binds from the lazy index: checks everything at bind, makes views per layer on first use."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from view_checks import same_view
from weightcache.checkpoints.checkpoint import with_headers
from weightcache.checkpoints.loader import load_to_memory
from weightcache.checkpoints.manifest import Manifest, TensorEntry, tensor_views
from weightcache.checkpoints.pipeline import plan_rank
from weightcache.checkpoints.sharding import Layout
from weightcache.checkpoints.tensor_index import TensorIndex
from weightcache.client.weights import expect
from weightcache.engine.config import ModelConfig
from weightcache.engine.model import Model
from weightcache.engine.parallel import Group
from weightcache_contract.errors import BindError

PROMPT = [3, 17, 101, 7, 250]
CASES = {
    "llama": (dict(family="llama"), "none"),
    "qwen2-tied": (dict(family="qwen2", tie_word_embeddings=True), "none"),
    "qwen3-moe-fp8": (
        dict(
            family="qwen3_moe",
            hidden_size=256,
            num_heads=4,
            num_kv_heads=2,
            num_layers=2,
            num_experts=4,
            moe_intermediate_size=128,
        ),
        "fp8",
    ),
}


def arena_of(ckpt: Path, quantization: str) -> tuple[torch.Tensor, list[TensorEntry], dict[str, str], tuple | None]:
    """A rank's arena as the daemon lays it out (in private memory), its entries, aliases and FP8 block."""
    expected = expect(str(ckpt), Layout(), dtype="float32", quantization=quantization)
    checkpoint = with_headers(expected.checkpoint)
    plan = plan_rank(checkpoint, expected.layout, expected.quant, expected.dtype)
    buffer, entries = load_to_memory(checkpoint, plan, expected.quant.weight_block_size)
    checkpoint.close()
    return buffer, entries, dict(plan.aliases), expected.quant.weight_block_size


def index_of(buffer: torch.Tensor, entries: list[TensorEntry], aliases: dict[str, str]) -> TensorIndex:
    manifest = Manifest.build("x", buffer.numel(), entries, aliases)
    manifest.validate_bounds()
    return manifest.index(buffer)


@pytest.mark.parametrize("case", CASES)
def test_layers_get_their_views_on_first_forward_and_they_are_the_eager_views(checkpoint_factory, case: str) -> None:
    spec, quantization = CASES[case]
    ckpt = checkpoint_factory(**spec)
    buffer, entries, aliases, block = arena_of(ckpt, quantization)
    index, eager = index_of(buffer, entries, aliases), tensor_views(buffer, entries)
    cfg = ModelConfig.from_checkpoint(ckpt)

    lazy = Model(cfg, index, aliases, Group(), block)
    assert index.materialised <= 3  # embedding, final norm, lm_head: no layer's view exists yet
    assert lazy.materialise_seconds == 0.0
    logits = lazy.forward(torch.tensor(PROMPT), lazy.new_cache(len(PROMPT)), all_logits=True)
    assert index.materialised == len(index) and lazy.materialise_seconds > 0.0

    reference = Model(cfg, eager, aliases, Group(), block)
    want = reference.forward(torch.tensor(PROMPT), reference.new_cache(len(PROMPT)), all_logits=True)
    assert torch.equal(logits, want)
    weights = list(lazy.weights())
    assert len({aliases.get(n, n) for n, _ in weights}) == len(entries)
    assert all(same_view(t, eager[aliases.get(n, n)]) for n, t in weights)


def test_reading_a_weight_of_an_unused_layer_materialises_that_layer_only(checkpoint_factory) -> None:
    spec, quantization = CASES["llama"]
    buffer, entries, aliases, block = arena_of(checkpoint_factory(**spec), quantization)
    index = index_of(buffer, entries, aliases)
    model = Model(ModelConfig.from_checkpoint(checkpoint_factory(**spec)), index, aliases, Group(), block)
    before = index.materialised
    weight = model.layers[1].q.weight
    assert weight is index["model.layers.1.self_attn.q_proj.weight"]
    assert index.materialised == before + 9  # that layer's nine tensors, no other layer's
    assert model.layers[0].materialise_seconds == 0.0 and model.layers[1].materialise_seconds > 0.0


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda e: [x for x in e if x.name != "model.layers.1.mlp.up_proj.weight"],
            "the weights lack 'model.layers.1.mlp.up_proj.weight'",
        ),
        (
            lambda e: [
                x.model_copy(update={"shape": x.shape[::-1], "stride": (1, x.shape[1])})
                if x.name == "model.layers.1.mlp.down_proj.weight"
                else x
                for x in e
            ],
            r"'model.layers.1.mlp.down_proj.weight' has torch.float32 \(352, 128\), the model needs torch.float32 "
            r"\(128, 352\)",
        ),
        (
            lambda e: [*e, e[0].model_copy(update={"name": "model.layers.1.self_attn.q_proj.bias"})],
            "have no place in the model, e.g. 'model.layers.1.self_attn.q_proj.bias'",
        ),  # layer 0 has no bias
        (
            lambda e: [*e, e[0].model_copy(update={"name": "model.layers.9.stray.weight"})],
            "have no place in the model, e.g. 'model.layers.9.stray.weight'",
        ),
    ],
)
def test_a_wrong_layer_weight_is_refused_at_bind_before_any_layer_view_is_made(
    checkpoint_factory, change, message: str
) -> None:
    spec, quantization = CASES["llama"]
    ckpt = checkpoint_factory(**spec)
    buffer, entries, aliases, block = arena_of(ckpt, quantization)
    index = index_of(buffer, change(entries), aliases)
    with pytest.raises(BindError, match=message):
        Model(ModelConfig.from_checkpoint(ckpt), index, aliases, Group(), block)
    assert index.materialised <= 3
