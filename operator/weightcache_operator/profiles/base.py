"""What the operator renders and checks differently per engine: one ``EngineProfile`` per engine.

The renderers (render/daemon.py, render/engine.py, render/layout.py) and validation.py build what
every cache shares and ask the cache's profile (``profile_of``) for the rest: the daemons' load
profile and its flags, the engine's command, environment and probes, the spec checks that engine
needs, and the spec fields that enter the two hashes. Every method has the default a profile
without an opinion wants, so a profile overrides only what its engine does differently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from weightcache_contract.launch import ArtifactsRunArgs

from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import ARTIFACT_MOUNT, CLI, served_model_name


class EngineProfile:
    """One engine: how its daemons load and its engine pods run. Subclasses set ``name`` and
    ``load_profile``; one with a block of its own under ``spec.engine`` names it in ``field``."""

    name: ClassVar[str]
    """The profile's name in messages and in ``PROFILES``."""
    load_profile: ClassVar[str]
    """The data plane's load profile its daemons run (``weightcache daemon --profile``)."""
    field: ClassVar[str | None] = None
    """The attribute of ``spec.engine`` whose presence selects this profile, if any."""

    @property
    def selector(self) -> str:
        """What in a spec selects this profile, as a user writes it (for the conflict message)."""
        return f"spec.engine.{self.field}" if self.field else f"the {self.name} profile"

    def selects(self, cache: WeightCache) -> bool:
        """Whether ``cache`` asks for this engine (the default profile is what no other selects)."""
        return self.field is not None and getattr(cache.spec.engine, self.field) is not None

    # --- validation -----------------------------------------------------------------------------

    def problems(self, cache: WeightCache) -> list[str]:
        """What ``cache`` cannot have with this engine, each naming the field and the fix."""
        return []

    # --- daemons ----------------------------------------------------------------------------------

    def daemon_args(self, cache: WeightCache) -> dict[str, Any]:
        """This engine's ``DaemonArgs`` fields (the ones the renderer does not fill for every cache)."""
        return {}

    def daemon_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        """Environment of the daemon container beyond ``POD_IP``."""
        return []

    def daemon_read_only_root(self, cache: WeightCache) -> bool:
        """Whether the daemon writes only to its volumes (then it gets a scratch ``TMPDIR``)."""
        return True

    def plans(self, cache: WeightCache) -> bool:
        """Whether the daemon's own planner computes this engine's arenas, so the daemon pod runs
        it first as an init container (render/plan.py)."""
        return False

    def uses_artifacts(self, cache: WeightCache) -> bool:
        """Whether daemon and engines share the node's compile-artifact directory (render/artifacts.py)."""
        return False

    def daemon_hash_fields(self, cache: WeightCache) -> dict[str, Any]:
        """Spec values that decide what the daemons hold beyond the ones every cache hashes; added
        to the daemon spec hash (render/layout.py). Empty: a cache's hash stays what it was."""
        return {}

    # --- engines ----------------------------------------------------------------------------------

    def engine_hash_exclude(self, cache: WeightCache) -> dict[str, Any]:
        """Parts of ``spec.engine`` left out of the engine version hash beyond the ones every cache
        leaves out (a pydantic ``exclude``), typically an optional field while it is unset."""
        return {}

    def engine_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        """Environment of every engine container beyond the weightcache client's."""
        return []

    def engine_command(self, cache: WeightCache) -> list[str] | None:
        """The first container's command, when the operator renders it (None: the template's)."""
        return None

    def engine_probes(self, cache: WeightCache) -> dict[str, dict[str, Any]]:
        """Probes of the serving (leader) engine container; the template's own win. The readiness
        probe's ``httpGet`` is also what the operator polls for hangs (responsiveness.py)."""
        return {}

    def warm_request(self, cache: WeightCache) -> tuple[str, dict[str, Any]]:
        """The request the warm sidecar sends the engine (render/warm.py): its path and JSON body,
        what a client sends, one generated token. Every engine of ours speaks OpenAI completions."""
        body = {"model": served_model_name(cache), "prompt": "warm", "max_tokens": 1, "temperature": 0}
        return "/v1/completions", body


def artifacts_run(load_profile: str, health_url: str) -> list[str]:
    """The wrapper an engine command runs under: it stages the compile caches of the engine of
    ``load_profile`` on the node and marks them for publication once ``health_url`` answers."""
    wrapper = ArtifactsRunArgs(dir=ARTIFACT_MOUNT, health=health_url, profile=load_profile)
    return [*CLI, "artifacts-run", *wrapper.to_argv(), "--"]


def own_command_problems(cache: WeightCache, selector: str) -> list[str]:
    """The engine template's first container setting its own command or args where a profile
    renders the engine's command (``selector``: what selects it): the rendered one would replace
    them without a word, so validation names them instead."""
    main = cache.spec.engine.template.spec.containers[0]
    return [
        f"spec.engine.template.spec.containers[0] ({main.get('name')}) sets {key}, but with {selector} the operator "
        f"renders the engine's command itself; remove {key} and put the engine's options in {selector}.args or "
        f"engineArgs"
        for key in ("command", "args")
        if main.get(key)
    ]


def reserved_flag_problems(
    field: str,
    lists: dict[str, list[str]],
    rendered: dict[str, str],
    shared: tuple[str, ...],
    name: Callable[[str], str] = lambda flag: flag,
) -> list[str]:
    """What an engine's argument lists (``{"args": …, "engineArgs": …}`` under ``spec.engine.<field>``)
    set that they may not: a flag the operator renders (``rendered``: flag → the spec field to use), or
    in ``engineArgs`` a flag that shapes the weights' fingerprint (``shared``: it belongs in ``args``).

    Read as the engines' argparse parsers read them (vLLM's and SGLang's allow abbreviations): a token
    ``--flag`` or ``--flag=value``, normalised by ``name`` (vLLM's underscore spellings), sets the
    reserved flag it names, else every reserved flag it is a prefix of. No other flag of SGLang 0.5.21 or vLLM 0.32 is a prefix of a
    reserved one, so a prefix that matches one is that flag, or ambiguous, which the engine refuses."""
    found: list[str] = []
    for key, tokens in lists.items():
        for token in tokens:
            if not token.startswith("-") or token in ("-", "--"):
                continue  # a value, or the end of the options
            flag = name(token.split("=", 1)[0])
            for reserved in _read_as(flag, rendered):
                found.append(
                    f"spec.engine.{field}.{key} sets {reserved}{_spelled(flag, reserved)}, which the operator renders "
                    f"itself; set {rendered[reserved]} instead"
                )
            if key == "engineArgs":
                for reserved in _read_as(flag, shared):
                    found.append(
                        f"spec.engine.{field}.engineArgs sets {reserved}{_spelled(flag, reserved)}, which shapes the "
                        f"weights' fingerprint; move it to spec.engine.{field}.args, which the daemons load with too"
                    )
    return found


def _read_as(flag: str, reserved: Iterable[str]) -> list[str]:
    """The reserved flags argparse could read ``flag`` as: itself if reserved (an exact match wins),
    else each reserved long flag it abbreviates (short flags like ``-q`` are matched exactly)."""
    names = set(reserved)
    if flag in names or not flag.startswith("--"):
        return [flag] if flag in names else []
    return sorted(f for f in names if f.startswith(flag))


def _spelled(flag: str, reserved: str) -> str:
    return "" if flag == reserved else f" (spelled {flag})"
