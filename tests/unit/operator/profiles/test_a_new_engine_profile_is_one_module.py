"""An engine is one profile module on the operator side: a profile defined and registered here,
and nowhere else, gets its daemons, engine pods, validation and hash fields rendered by the shared
renderers; a spec selecting two engines is refused naming both; and no operator module outside
``profiles/`` and ``spec/`` names an engine (read from the modules' syntax trees, not their prose)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from typing import Any

import pytest
from builders import BASE, cache_of, changed
from engine_words import words_of
from rendered import daemon_command, env_of, main_container
from repo_root import ROOT
from weightcache.cli import build_parser
from weightcache_operator.observe.validation import parse
from weightcache_operator.profiles import DEFAULT, PROFILES, EngineProfile, profile_of, register
from weightcache_operator.render import daemon_daemonset, daemon_spec_hash
from weightcache_operator.spec import WeightCache

OPERATOR = ROOT / "operator" / "weightcache_operator"
SELECTOR = "example.com/engine"


class Toy(EngineProfile):
    """A test engine, selected by an annotation on the engine template (the API has no block for it)."""

    name = "toy"
    load_profile = "toy"

    @property
    def selector(self) -> str:
        return f"spec.engine.template.metadata.annotations[{SELECTOR}]"

    def selects(self, cache: WeightCache) -> bool:
        return ((cache.spec.engine.template.metadata or {}).get("annotations") or {}).get(SELECTOR) == "toy"

    def problems(self, cache: WeightCache) -> list[str]:
        if cache.spec.parallelism.pipeline > 1:
            return ["spec.parallelism.pipeline must be 1: toy engines do not pipeline; set it to 1"]
        return []

    def daemon_env(self, cache: WeightCache) -> list[dict[str, Any]]:
        return [{"name": "TOY_LOADER", "value": "1"}]

    def daemon_hash_fields(self, cache: WeightCache) -> dict[str, Any]:
        return {"toy": {"layout": "v1"}}

    def engine_command(self, cache: WeightCache) -> list[str]:
        return ["toy-serve", "--port", str(cache.spec.engine.port)]

    def engine_probes(self, cache: WeightCache) -> dict[str, dict[str, Any]]:
        return {"readinessProbe": {"httpGet": {"path": "/toy-ready", "port": cache.spec.engine.port}}}


@pytest.fixture
def toy() -> Iterator[EngineProfile]:
    profile = register(Toy())
    try:
        yield profile
    finally:
        del PROFILES[profile.name]


def toy_body(**changes: Any) -> dict[str, Any]:
    template = BASE["spec"]["engine"]["template"]
    metadata = {**template["metadata"], "annotations": {SELECTOR: "toy"}}
    return changed(BASE, **{"engine.template.metadata": metadata, **changes})


def test_a_registered_profile_renders_its_daemons_and_engines_through_the_shared_renderers(toy: EngineProfile) -> None:
    cache = cache_of(toy_body())
    assert profile_of(cache) is toy
    daemon = daemon_command(cache)
    parsed = build_parser().parse_args(daemon[daemon.index("daemon") :])
    assert parsed.profile == "toy" and parsed.tp_size == 2  # the data plane's parser reads it
    containers = daemon_daemonset(cache)["spec"]["template"]["spec"]
    assert env_of(next(c for c in containers["containers"] if c["name"] == "daemon"))["TOY_LOADER"] == "1"
    assert [c["name"] for c in containers["initContainers"]] == ["own-host-dirs"]  # no planner: it does not plan
    main = main_container(cache)
    assert main["command"] == ["toy-serve", "--port", "8000"]
    assert main["readinessProbe"]["httpGet"]["path"] == "/toy-ready"
    assert env_of(main)["WEIGHTCACHE_ENGINE_SOCKET_DIR"] == "/run/weightcache"  # the client's, as for any engine


def test_a_profiles_validation_and_hash_fields_apply_to_its_caches_only(toy: EngineProfile) -> None:
    assert parse(toy_body(**{"parallelism": {"tensor": 1, "pipeline": 2}}))[1] == [
        "spec.parallelism.pipeline must be 1: toy engines do not pipeline; set it to 1"
    ]
    assert parse(changed(BASE, **{"parallelism": {"tensor": 1, "pipeline": 2}}))[1] == []
    assert daemon_spec_hash(cache_of(toy_body())) != daemon_spec_hash(cache_of(BASE))
    assert profile_of(cache_of(BASE)) is DEFAULT


def test_a_spec_selecting_two_engines_is_refused_naming_both_and_the_fix(toy: EngineProfile) -> None:
    body = toy_body(**{"engine.vllm": {"kvCacheSpaceGiB": 1}})
    body["spec"]["engine"]["template"]["spec"]["containers"][0].pop("command")
    cache, problems = parse(body)
    assert problems == [
        "the spec selects 2 engines at once: spec.engine.vllm (vllm) and "
        f"spec.engine.template.metadata.annotations[{SELECTOR}] (toy); keep the one the engines run and remove the others"
    ]
    assert cache is not None
    with pytest.raises(ValueError, match="selects 2 engines"):
        profile_of(cache)


def test_a_second_profile_of_one_name_is_refused(toy: EngineProfile) -> None:
    with pytest.raises(ValueError, match="'toy' is registered already"):
        register(Toy())


# --- no operator module outside profiles/ and spec/ names an engine --------------------------------


PROFILE_MODULES = {p.stem for p in (OPERATOR / "profiles").glob("*.py")} - {"__init__", "base"}


def engine_mentions(source: str, module: str) -> set[str]:
    """Where the code of ``module`` (dotted, inside weightcache_operator) names an engine: an import
    of a profile's own module or of a ``*_PROFILE`` constant, an attribute that is a profile's spec
    block, an identifier with an engine's name as a word, a string that is a profile's name. The
    default profile's name ("reference") counts only as a string: as a word it is ordinary
    Kubernetes vocabulary (owner references, a referenced InferencePool)."""
    words = {w for p in PROFILES.values() if p is not DEFAULT for w in (p.name, p.load_profile, p.field) if w}
    fields = {p.field for p in PROFILES.values() if p.field}
    names = {p.name for p in PROFILES.values()} | {p.load_profile for p in PROFILES.values()}
    package = module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        where = f"{module}:{getattr(node, 'lineno', 0)}"
        identifiers: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            target = [*base, *(node.module.split(".") if node.module else [])]
            for path in [target, *([*target, a.name] for a in node.names)]:
                if path[:2] == ["weightcache_operator", "profiles"] and len(path) > 2 and path[2] in PROFILE_MODULES:
                    found.add(f"{where} imports {'.'.join(path[:3])}")
            found |= {f"{where} imports {a.name}" for a in node.names if a.name.endswith("_PROFILE")}
            identifiers += [a.asname or a.name for a in node.names]
        elif isinstance(node, ast.Attribute):
            if node.attr in fields:
                found.add(f"{where} reads .{node.attr}")
            identifiers.append(node.attr)
        elif isinstance(node, ast.Name):
            identifiers.append(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            identifiers.append(node.name)
        elif isinstance(node, ast.arg):
            identifiers.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.add(f"{where} has the string {node.value!r}")
        found |= {f"{where} names {i}" for i in identifiers if words & words_of(i)}
    return found


def test_the_check_sees_an_engine_named_in_code_but_not_in_prose() -> None:
    named = """
from .render.layout import daemon_spec_hash
from .profiles.vllm import vllm_args
from weightcache_contract.launch import VLLM_PROFILE

def uses_vllm(cache: VllmProfile):
    '''vLLM caches, unlike the reference engine's'''  # vllm in a comment
    return cache.spec.engine.vllm is not None or cache.profile == "vllm"
"""
    assert engine_mentions(named, "weightcache_operator.example") == {
        "weightcache_operator.example:3 imports weightcache_operator.profiles.vllm",
        "weightcache_operator.example:3 names vllm_args",
        "weightcache_operator.example:4 imports VLLM_PROFILE",
        "weightcache_operator.example:4 names VLLM_PROFILE",
        "weightcache_operator.example:6 names uses_vllm",
        "weightcache_operator.example:6 names VllmProfile",
        "weightcache_operator.example:8 reads .vllm",
        "weightcache_operator.example:8 names vllm",
        "weightcache_operator.example:8 has the string 'vllm'",
    }


def test_no_operator_module_outside_profiles_and_spec_names_an_engine() -> None:
    found: set[str] = set()
    for path in sorted(OPERATOR.rglob("*.py")):
        relative = path.relative_to(OPERATOR.parent).with_suffix("")
        if relative.parts[1] not in ("profiles", "spec"):
            found |= engine_mentions(path.read_text(), ".".join(relative.parts))
    assert not found, f"ask the cache's profile (profiles.profile_of) instead of naming its engine: {sorted(found)}"
