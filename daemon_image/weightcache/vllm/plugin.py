"""The ``vllm.general_plugins`` entry point: registers the ``weightcache`` load format.

vLLM calls it in every process that may load a model (API server, engine core, each worker),
possibly more than once per process, so it registers only when not registered yet.
"""

from __future__ import annotations


def register() -> None:
    from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER, register_model_loader

    from . import LOAD_FORMAT

    if LOAD_FORMAT not in _LOAD_FORMAT_TO_MODEL_LOADER:
        from .loader import WeightcacheModelLoader

        register_model_loader(LOAD_FORMAT)(WeightcacheModelLoader)
