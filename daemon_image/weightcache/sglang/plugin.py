"""SGLang's plug-in entry point (``sglang.srt.plugins``: ``weightcache``), called by SGLang's
``load_plugins`` in each of its processes that parse arguments or load weights (the server, the
``Engine``, every scheduler): ``--load-format weightcache`` becomes one of the load formats SGLang's
parser accepts, and a ``LoadConfig`` of that format is given the weightcache loader class, which
SGLang's ``get_model_loader`` instantiates as it does any loader class. SGLang's own enum of load
formats knows no plug-in's, hence the hook on its check (``HookRegistry``, applied by
``load_plugins`` once every plug-in has registered). Nothing of SGLang is patched beyond that one
method, and nothing changes for any other load format."""

from __future__ import annotations

from typing import Any

from weightcache_contract.launch import LOAD_FORMAT

VERIFY = "sglang.srt.configs.load_config.LoadConfig._verify_load_format"


def register() -> None:
    from sglang.srt.arg_groups.choices import LOAD_FORMAT_CHOICES, add_load_format_choices
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if LOAD_FORMAT not in LOAD_FORMAT_CHOICES:
        add_load_format_choices([LOAD_FORMAT])
    HookRegistry.register(VERIFY, weightcache_loader_class, HookType.AROUND)


def weightcache_loader_class(original: Any, load_config: Any, *args: Any, **kwargs: Any) -> Any:
    """``load_format="weightcache"`` → the loader class (SGLang then skips its enum's check);
    every other format as SGLang checks it."""
    if isinstance(load_config.load_format, str) and load_config.load_format.lower() == LOAD_FORMAT:
        from .loader import WeightcacheModelLoader

        load_config.load_format = WeightcacheModelLoader
    return original(load_config, *args, **kwargs)
