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


def _slots(model: nn.Module) -> dict[str, tuple[nn.Module, str, torch.Tensor, bool]]:
    """Every parameter and persistent buffer, tied ones under each of their names.

    An explicit stack instead of ``named_modules``: with tens of thousands of tensors the
    recursive generator alone costs more than the binding.
    """
    slots: dict[str, tuple[nn.Module, str, torch.Tensor, bool]] = {}
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        for leaf, param in module._parameters.items():
            if param is not None:
                slots[prefix + leaf] = (module, leaf, param, True)
        skip = module._non_persistent_buffers_set
        for leaf, buf in module._buffers.items():
            if buf is not None and leaf not in skip:
                slots[prefix + leaf] = (module, leaf, buf, False)
        for child_name, child in module._modules.items():
            if child is not None:
                stack.append((f"{prefix}{child_name}.", child))
    return slots


def bind(model: nn.Module, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str] | None = None) -> None:
    """Replace every parameter and persistent buffer; all checks pass before anything changes."""
    aliases = dict(aliases or {})
    slots = _slots(model)
    if len(slots) != len(tensors) + len(aliases) or not slots.keys() == (tensors.keys() | aliases.keys()):
        provided = set(tensors) | set(aliases)
        missing = sorted(set(slots) - provided)
        if missing:
            raise BindError(f"{len(missing)} model tensor(s) are not in the cache, e.g. {missing[0]!r}")
        extra = sorted(provided - set(slots))
        raise BindError(f"{len(extra)} cached tensor(s) have no place in the model, e.g. {extra[0]!r}")
    for name, (_, _, current, _) in slots.items():
        source = tensors[aliases.get(name, name)]
        if source.shape != current.shape or source.dtype != current.dtype:
            raise BindError(
                f"{name!r}: cache has {source.dtype} {tuple(source.shape)}, model wants "
                f"{current.dtype} {tuple(current.shape)}"
            )
    params: dict[str, nn.Parameter] = {}
    for name, (module, leaf, _, is_param) in slots.items():
        target = aliases.get(name, name)
        if is_param:
            param = params.get(target)
            if param is None:
                param = params[target] = nn.Parameter(tensors[target], requires_grad=False)
            module._parameters[leaf] = param
        else:
            module._buffers[leaf] = tensors[target]
