"""Load profiles: how a daemon rank fills its arena, one ``LoadProfile`` per engine layout, found
by name (``weightcache daemon --profile NAME``), the shape of vLLM's ``ModelLoaderRegistry``.

A profile registers itself with ``@register_profile(name)``; ``get_profile`` returns it, or
refuses an unknown name with the known ones. The built-in profiles live with their engines
(``BUILTIN``) and are imported on the first lookup, so this module stays light: the parser, the
probe and a re-adopting daemon import it without torch, and any package may import it.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from weightcache_contract.errors import WeightCacheError

BUILTIN = ("weightcache.daemon.profile", "weightcache.sglang.profile", "weightcache.vllm.profile")
"""The modules that register the built-in profiles (``weightcache_contract.launch.PROFILES``)."""


class LoadProfile:
    """How one rank of ``weightcache daemon --profile <name>`` loads; the launcher of a pod's
    ranks (``--ranks``) and the serving of a handed-over arena are the daemon's own, whatever the
    profile. A subclass implements ``run_rank`` and overrides the rest where it differs."""

    name: ClassVar[str] = ""

    def check(self, args: argparse.Namespace) -> None:
        """Refuses flags that belong to another profile, before the launcher or a rank starts."""

    def rank_fields(self, args: argparse.Namespace, ranks: list[int]) -> dict[str, Any]:
        """``DaemonArgs`` fields the launcher sets on each of ``ranks`` beyond its flags (``rank_args``)."""
        return {}

    def run_rank(self, args: argparse.Namespace) -> int:
        """Loads and serves one rank; the process's exit code."""
        raise NotImplementedError(f"load profile {self.name!r} does not implement run_rank")

    def compile_env(self, data: Path, environ: Mapping[str, str]) -> dict[str, str]:
        """``weightcache artifacts-run``: the variables that point this engine's own compile caches
        under ``data`` (torch's are pointed there for every engine), and defaults ``environ``
        (the engine's environment) does not set."""
        return {}


_REGISTRY: dict[str, LoadProfile] = {}
P = TypeVar("P", bound=type[LoadProfile])


def register_profile(name: str) -> Callable[[P], P]:
    """Class decorator: registers an instance of the class under ``name`` (refusing a taken name,
    a built-in one included)."""

    def register(cls: P) -> P:
        if cls.__module__ not in BUILTIN:
            _import_builtins()
        if name in _REGISTRY:
            raise ValueError(f"load profile {name!r} is registered already (by {type(_REGISTRY[name]).__name__})")
        cls.name = name
        _REGISTRY[name] = cls()
        return cls

    return register


def unregister_profile(name: str) -> None:
    """Removes a registered profile (tests that register their own)."""
    _REGISTRY.pop(name, None)


def _import_builtins() -> None:
    for module in BUILTIN:
        importlib.import_module(module)  # each registers its profile on its first import


def known_profiles() -> list[str]:
    """The names ``get_profile`` accepts, the built-in ones included."""
    _import_builtins()
    return sorted(_REGISTRY)


def get_profile(name: str) -> LoadProfile:
    """The profile registered as ``name``; an unknown name is refused with the known ones."""
    known = known_profiles()
    if name not in _REGISTRY:
        raise WeightCacheError(f"--profile {name!r} is no load profile here; use one of: {', '.join(known)}")
    return _REGISTRY[name]
