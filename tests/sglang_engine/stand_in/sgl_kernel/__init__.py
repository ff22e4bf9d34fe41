"""A stand-in for SGLang's kernel library (``sgl_kernel``, the ``sglang-kernel`` package), on the path
of the SGLang test environment's processes only (``sglang_harness.env``), never in the product.

Why: sglang-kernel has no CPU build (its libraries need ``libcuda.so.1``), yet SGLang's CPU path
imports names from it at import time (e.g. ``copy_all_layer_kv_cache_cpu`` in
``kernels/ops/kvcache/cache_move.py``). Without Intel AMX, SGLang's CPU engine runs its torch-native
backend, which never calls them. So every attribute of this module and of any ``sgl_kernel.<sub>``
module is a function that records its call and raises: an SGLang run that reached a kernel fails
loudly, and ``test_no_kernel_of_the_stand_in_was_called`` reads the record
(``$WEIGHTCACHE_SGL_KERNEL_CALLS``) to prove none was called in the suite's runs.

``sgl_kernel.scalar_type`` stays absent: SGLang falls back to its own scalar types when that import
fails, and a stand-in function there would break its import. And ``torch.ops.sgl_kernel`` stays
empty, so SGLang's check for its AMX kernels (``convert_weight_packed``) says no.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

__version__ = "0.0.0+weightcache.stand.in"
CALLS = "WEIGHTCACHE_SGL_KERNEL_CALLS"
ABSENT = {"scalar_type"}


def _raising(qualname: str) -> Callable[..., Any]:
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        record = os.environ.get(CALLS)
        if record:
            with open(record, "a") as out:
                out.write(f"{os.getpid()} {qualname}\n")
        raise RuntimeError(f"{qualname} is the test stand-in for SGLang's kernel library, which has no CPU build")

    stand_in.__qualname__ = stand_in.__name__ = qualname.rpartition(".")[2]
    return stand_in


def _module_getattr(module: str) -> Callable[[str], Any]:
    def getattr_(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _raising(f"{module}.{name}")

    return getattr_


class _Submodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``sgl_kernel.<anything>`` imports as another module of raising functions."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(__name__ + ".") or fullname.rpartition(".")[2] in ABSENT:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _module_getattr(spec.name)  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


__getattr__ = _module_getattr(__name__)
sys.meta_path.append(_Submodules())
