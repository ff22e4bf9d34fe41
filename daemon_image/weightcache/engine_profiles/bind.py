"""Bind mapped arena views into an engine's model built on the meta device.

The arena holds the rank's post-processed state, so its names are the post-processed model's:
each cached tensor replaces the module slot of that name, or is registered where
post-processing would have created it. Tied names get the very same object. What the meta
model still holds afterwards — placeholders that post-processing consumes (e.g. a quantization
method's raw scales) — must be gone once the engine has rebuilt what it keeps on the Python side (vLLM:
``process_weights_after_loading`` in its "weights already processed" mode); ``check_bound``
refuses any leftover by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn
from weightcache_contract.errors import BindError


@dataclass
class Bound:
    mapped: int  # tensors that are views of the arena
    private: int  # tensors copied because the engine writes them (``written_in_place``)
    private_bytes: int


def bind_arena(
    model: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    kinds: dict[str, str],
    aliases: dict[str, str],
    written_in_place: frozenset[str] = frozenset(),
) -> Bound:
    """``written_in_place``: leaf names the engine writes into after binding; each engine gets its
    own copy of those (a write into a read-only map faults), everything else stays a view."""
    modules = dict(model.named_modules(remove_duplicate=False))
    placed: dict[str, torch.Tensor] = {}
    private = private_bytes = 0
    for name, view in tensors.items():
        module_name, _, leaf = name.rpartition(".")
        if module_name not in modules:
            raise BindError(
                f"cached tensor {name!r} has no module {module_name!r} in this model; the arena was "
                "published for another model or engine version"
            )
        if leaf in written_in_place:
            view = view.clone()
            private += 1
            private_bytes += view.numel() * view.element_size()
        placed[name] = nn.Parameter(view, requires_grad=False) if kinds[name] == "parameter" else view
    for alias, target in aliases.items():
        placed[alias] = placed[target]
    for name, value in placed.items():
        module_name, _, leaf = name.rpartition(".")
        module = modules.get(module_name)
        if module is None:
            raise BindError(f"cached alias {name!r} has no module {module_name!r} in this model")
        # Slot replacement, not ``param.data =``: a meta tensor's data cannot be swapped.
        module._parameters.pop(leaf, None)
        module._buffers.pop(leaf, None)
        if isinstance(value, nn.Parameter):
            module._parameters[leaf] = value
        else:
            module._buffers[leaf] = value
    return Bound(mapped=len(tensors) - private, private=private, private_bytes=private_bytes)


def check_bound(model: nn.Module) -> None:
    """Refuse a model that still holds meta tensors (what the arena lacked and post-processing kept)."""
    left = [name for name, t in _named_tensors(model) if t.device.type == "meta"]
    if left:
        raise BindError(
            f"{len(left)} model tensor(s) are not in the cache, e.g. {left[0]!r}; the arena was "
            "published for another model, quantization or engine version"
        )


def outside_mapping(model: nn.Module, start: int, end: int) -> list[str]:
    """Names of non-empty tensors whose bytes do not lie inside ``[start, end)``."""
    out = []
    for name, t in _named_tensors(model):
        if t.numel() and not (start <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= end):
            out.append(name)
    return out


def _named_tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
