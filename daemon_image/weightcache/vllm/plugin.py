"""The ``vllm.general_plugins`` entry point: registers the ``weightcache`` load format and starts
the engine's startup timeline (startup.py).

vLLM calls it in every process that may load a model (API server, engine core, each worker),
possibly more than once per process, so it registers only when not registered yet.

On a vLLM outside ``versions.supported()`` the load format is registered as a loader that refuses,
naming the supported versions: vLLM runs every installed plug-in at start and does not catch what
one raises, so raising here would stop engines that never asked for the cache (``--load-format
auto``), and registering nothing would leave ``--load-format weightcache`` to fail without saying why.
"""

from __future__ import annotations

import logging

log = logging.getLogger("vllm.weightcache")


def register() -> None:
    import vllm
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER, register_model_loader
    from weightcache_contract.errors import WeightCacheError
    from weightcache_contract.launch import LOAD_FORMAT

    from . import startup, versions

    startup.install()  # the startup timeline (startup.py); once per process
    if LOAD_FORMAT in _LOAD_FORMAT_TO_MODEL_LOADER:
        return
    try:
        versions.check(vllm.__version__)
    except WeightCacheError as exc:
        log.warning("--load-format %s is not available: %s", LOAD_FORMAT, exc)
        register_model_loader(LOAD_FORMAT)(_refusing_loader(str(exc)))
        return
    from .loader import WeightcacheModelLoader  # imports what only a supported vLLM is known to have

    register_model_loader(LOAD_FORMAT)(WeightcacheModelLoader)


def _refusing_loader(reason: str) -> type:
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from weightcache_contract.errors import WeightCacheError

    class UnsupportedVllm(BaseModelLoader):
        def __init__(self, load_config: object) -> None:
            raise WeightCacheError(reason)

        def download_model(self, model_config: object) -> None:
            raise WeightCacheError(reason)

        def load_weights(self, model: object, model_config: object) -> None:
            raise WeightCacheError(reason)

    return UnsupportedVllm
