import pytest
import torch
from torch import nn
from weightcache.client.binding import bind, empty_model
from weightcache_contract.errors import BindError


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4, bias=False)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied, as in Qwen2
        self.register_buffer("scale", torch.ones(4))
        self.register_buffer("cache", torch.zeros(2), persistent=False)


def make() -> Tiny:
    with empty_model():
        return Tiny()


def weights() -> dict[str, torch.Tensor]:
    return {"embed.weight": torch.randn(10, 4), "proj.weight": torch.randn(4, 4), "scale": torch.full((4,), 2.0)}


def test_empty_model_puts_parameters_on_meta_and_keeps_computed_buffers() -> None:
    model = make()
    assert all(p.is_meta for p in model.parameters())
    assert not model.cache.is_meta and model.cache.shape == (2,)


def test_bind_uses_the_given_tensors_without_copying_and_keeps_ties() -> None:
    model, w = make(), weights()
    bind(model, w, {"head.weight": "embed.weight"})
    assert model.proj.weight.data_ptr() == w["proj.weight"].data_ptr()
    assert model.head.weight is model.embed.weight
    assert model.scale.data_ptr() == w["scale"].data_ptr()
    out = model.head(model.proj(model.embed(torch.tensor([1, 2]))))
    assert torch.allclose(out, (w["embed.weight"][[1, 2]] @ w["proj.weight"].T) @ w["embed.weight"].T)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda w, a: w.pop("proj.weight"), "model tensor 'proj.weight' is not in the cache"),
        (lambda w, a: w.update({"stray.weight": torch.zeros(1)}), "have no place in the model, e.g. 'stray.weight'"),
        (
            lambda w, a: w.update({"proj.weight": torch.zeros(4, 5)}),
            r"'proj.weight': cache has torch.float32 \(4, 5\), model wants torch.float32 \(4, 4\)",
        ),
        (lambda w, a: w.update({"scale": torch.ones(4, dtype=torch.bfloat16)}), "'scale': cache has torch.bfloat16"),
        (lambda w, a: a.pop("head.weight"), "model tensor 'head.weight' is not in the cache"),
        (lambda w, a: a.update({"nowhere": "embed.weight"}), "e.g. 'nowhere'"),
    ],
)
def test_bind_refuses_missing_extra_and_mismatched_tensors_by_name(mutate, message) -> None:
    model, w, aliases = make(), weights(), {"head.weight": "embed.weight"}
    mutate(w, aliases)
    with pytest.raises(BindError, match=message):
        bind(model, w, aliases)
    assert all(p.is_meta for p in model.parameters())  # nothing was half-bound
