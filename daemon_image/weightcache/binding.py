"""Bind cached tensors into a model whose parameters were never allocated.

``empty_model`` builds a model with parameters on the meta device (buffers such as rotary
frequencies, which are computed rather than loaded, stay real). ``bind`` then replaces every
parameter and persistent buffer with its cached tensor — no copy — and refuses, naming the
tensor, anything missing, extra, or of the wrong shape or dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Mapping

import torch
from torch import nn

from .errors import BindError


@contextlib.contextmanager
def empty_model() -> Iterator[None]:
    """Within this block, new modules get meta parameters: no memory, no random init cost."""
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def bind(model: nn.Module, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str] | None = None) -> None:
    """Replace every parameter and persistent buffer; every check passes before anything changes.

    One walk over the module tree with an explicit stack: with tens of thousands of tensors,
    ``named_modules`` and a second pass over a name → slot table cost more than the binding.
    Tied parameters (one Parameter under several names) stay tied.
    """
    aliases = dict(aliases or {})
    params: dict[str, nn.Parameter] = {}
    used: set[str] = set()
    pending: list[tuple[dict, str, torch.Tensor]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        for leaf, current in module._parameters.items():
            if current is not None:
                name = prefix + leaf
                target = aliases.get(name, name)
                param = params.get(target)
                if param is None:
                    param = params[target] = nn.Parameter(_checked(name, target, current, tensors), requires_grad=False)
                used.add(name)
                pending.append((module._parameters, leaf, param))
        skip = module._non_persistent_buffers_set
        for leaf, current in module._buffers.items():
            if current is not None and leaf not in skip:
                name = prefix + leaf
                target = aliases.get(name, name)
                used.add(name)
                pending.append((module._buffers, leaf, _checked(name, target, current, tensors)))
        for child_name, child in module._modules.items():
            if child is not None:
                stack.append((f"{prefix}{child_name}.", child))
    targets = {aliases.get(n, n) for n in used} if aliases else used
    extra = sorted((tensors.keys() - targets) | (aliases.keys() - used))
    if extra:
        raise BindError(f"{len(extra)} cached tensor(s) have no place in the model, e.g. {extra[0]!r}")
    for slots, leaf, value in pending:
        slots[leaf] = value


def _checked(name: str, target: str, current: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    source = tensors.get(target)
    if source is None:
        raise BindError(f"model tensor {name!r} is not in the cache")
    if source.shape != current.shape or source.dtype != current.dtype:
        raise BindError(f"{name!r}: cache has {source.dtype} {tuple(source.shape)}, model wants "
                        f"{current.dtype} {tuple(current.shape)}")
    return source
