"""SGLang's plug-in entry point (``sglang.srt.plugins``: ``weightcache``), called by SGLang's
``load_plugins`` in each of its processes that parse arguments or load weights (the server, the
``Engine``, every scheduler): ``--load-format weightcache`` becomes one of the load formats SGLang's
parser accepts, and a ``LoadConfig`` of that format is given the weightcache loader class, which
SGLang's ``get_model_loader`` instantiates as it does any loader class. SGLang's own enum of load
formats knows no plug-in's, hence the hook on its check (``HookRegistry``, applied by
``load_plugins`` once every plug-in has registered). SGLang 0.5.17's ``get_model_loader`` picks its
AutoRound and ModelOpt loaders for those quantizations before it looks at a loader class (0.5.21
looks at the class first), so a second hook hands the class its ``LoadConfig`` first on every
version: ``--load-format weightcache`` never loads from disk behind the loader's back. Nothing of
SGLang is patched beyond those two functions, and nothing changes for any other load format."""

from __future__ import annotations

from typing import Any

from weightcache_contract.launch import LOAD_FORMAT

VERIFY = "sglang.srt.configs.load_config.LoadConfig._verify_load_format"
GET_LOADER = "sglang.srt.model_loader.loader.get_model_loader"


def register() -> None:
    # Both versions export these from server_args (0.5.21 re-exports them from arg_groups.choices).
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.server_args import LOAD_FORMAT_CHOICES, add_load_format_choices

    if LOAD_FORMAT not in LOAD_FORMAT_CHOICES:
        add_load_format_choices([LOAD_FORMAT])
    HookRegistry.register(VERIFY, weightcache_loader_class, HookType.AROUND)
    HookRegistry.register(GET_LOADER, weightcache_loader_first, HookType.AROUND)


def weightcache_loader_class(original: Any, load_config: Any, *args: Any, **kwargs: Any) -> Any:
    """``load_format="weightcache"`` → the loader class (SGLang then skips its enum's check);
    every other format as SGLang checks it."""
    if isinstance(load_config.load_format, str) and load_config.load_format.lower() == LOAD_FORMAT:
        from .loader import WeightcacheModelLoader

        load_config.load_format = WeightcacheModelLoader
    return original(load_config, *args, **kwargs)


def weightcache_loader_first(original: Any, *args: Any, **kwargs: Any) -> Any:
    """The weightcache loader for its ``LoadConfig``, whatever the quantization; every other
    ``LoadConfig`` as SGLang chooses its loader."""
    from .loader import WeightcacheModelLoader

    load_config = kwargs.get("load_config", args[0] if args else None)
    if getattr(load_config, "load_format", None) is WeightcacheModelLoader:
        return WeightcacheModelLoader(load_config)
    return original(*args, **kwargs)
