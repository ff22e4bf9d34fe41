"""Bind cached tensors into a model whose parameters were never allocated.

``empty_model`` builds a model with parameters on the meta device (buffers such as rotary
frequencies, which are computed rather than loaded, stay real). ``bind`` then replaces every
parameter and persistent buffer with its cached tensor — no copy — and refuses, naming the
tensor, anything missing, extra, or of the wrong shape or dtype.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

import torch
from torch import nn
from weightcache_contract.errors import BindError

from ..gcpause import gc_paused


@contextlib.contextmanager
def empty_model() -> Iterator[None]:
    """Within this block, new modules get meta parameters: no memory, no random init cost."""
    original = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def bind(model: nn.Module, tensors: Mapping[str, torch.Tensor], aliases: Mapping[str, str] | None = None) -> None:
    """Replace every parameter and persistent buffer; every check passes before anything changes.

    One walk over the module tree with an explicit stack, and the per-tensor work inlined: with
    tens of thousands of tensors, Python overhead per tensor is the whole cost of binding.
    Tied parameters (one Parameter under several names) stay tied. The collector is paused
    meanwhile (see gcpause): its walks over the skeleton would cost more than the binding.
    """
    with gc_paused():
        _bind(model, tensors, dict(aliases or {}))


def _bind(model: nn.Module, tensors: Mapping[str, torch.Tensor], aliases: dict[str, str]) -> None:
    get, resolve = tensors.get, aliases.get
    make_param = torch.Tensor._make_subclass  # what nn.Parameter(t, requires_grad=False) does, minus its wrapper
    Parameter = nn.Parameter
    params: dict[str, nn.Parameter] = {}
    used: list[str] = []
    pending: list[tuple[dict[str, Any], str, torch.Tensor]] = []
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        prefix, module = stack.pop()
        for leaf, current in module._parameters.items():
            if current is None:
                continue
            name = prefix + leaf
            target = resolve(name, name)
            param = params.get(target)
            if param is None:
                source = get(target)
                if source is None or source.shape != current.shape or source.dtype != current.dtype:
                    _refuse(name, source, current)
                param = params[target] = make_param(Parameter, source, False)
            used.append(name)
            pending.append((module._parameters, leaf, param))
        if module._buffers:
            skip = module._non_persistent_buffers_set
            for leaf, buffer in module._buffers.items():
                if buffer is not None and leaf not in skip:
                    name = prefix + leaf
                    source = get(resolve(name, name))
                    if source is None or source.shape != buffer.shape or source.dtype != buffer.dtype:
                        _refuse(name, source, buffer)
                    used.append(name)
                    pending.append((module._buffers, leaf, source))
        for child_name, child in module._modules.items():
            if child is not None:
                stack.append((prefix + child_name + ".", child))
    used_set = set(used)
    targets = {resolve(n, n) for n in used_set} if aliases else used_set
    extra = sorted((tensors.keys() - targets) | (aliases.keys() - used_set))
    if extra:
        raise BindError(f"{len(extra)} cached tensor(s) have no place in the model, e.g. {extra[0]!r}")
    for slots, leaf, value in pending:
        slots[leaf] = value


def _refuse(name: str, source: torch.Tensor | None, current: torch.Tensor) -> NoReturn:
    if source is None:
        raise BindError(f"model tensor {name!r} is not in the cache")
    raise BindError(
        f"{name!r}: cache has {source.dtype} {tuple(source.shape)}, model wants {current.dtype} {tuple(current.shape)}"
    )
