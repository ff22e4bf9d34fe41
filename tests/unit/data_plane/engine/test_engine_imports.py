"""The reference engine's serving path imports what serving needs and nothing heavier.

An engine's start is mostly imports (docs/benchmarks.md, *Reference engine restart*): torch is
unavoidable, but transformers (seconds on its own), vLLM, sympy or torch's compiler stack would
each add to every start for nothing, and it takes one stray module-level import to bring them
back. Checked in fresh interpreters, so another test's imports cannot hide or cause a finding.
"""

import json
import subprocess
import sys

# Modules a rank process loads before it serves (command → rank → model, scheduler, server, ...).
SERVING_PATH = [
    "weightcache.cli",
    "weightcache.engine.command",
    "weightcache.engine.rank",
    "weightcache.engine.server",
    "weightcache.engine.tokenizer",
    "weightcache.engine.weights",
]
# Never on the serving path: transformers and its hub client (the oracle's and the demo's old
# engine), vLLM, and what torch only needs to compile (sympy, dynamo, inductor, triton). jinja2
# is imported only to render a chat template, when a chat request needs one.
NEVER = ["transformers", "huggingface_hub", "vllm", "sympy", "triton", "torch._dynamo", "torch._inductor", "jinja2"]

PROBE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
never = sys.argv[2].split(",")
print(json.dumps(sorted(m for m in never if m in sys.modules)))
"""


def loaded(module: str, names: list[str]) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, module, ",".join(names)], capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(out.stdout)


def test_the_serving_path_imports_no_transformers_vllm_or_compiler_stack() -> None:
    found = {module: names for module in SERVING_PATH if (names := loaded(module, NEVER))}
    assert not found, f"the engine's serving path imports what it never uses (make the import lazy): {found}"


def test_a_follower_rank_imports_no_http_server() -> None:
    """Ranks other than 0 serve no HTTP: aiohttp is imported by rank 0's server only."""
    assert loaded("weightcache.engine.rank", ["aiohttp"]) == []


def test_the_check_sees_a_module_that_is_imported() -> None:
    """The probe itself: the server does import aiohttp, and it is reported."""
    assert loaded("weightcache.engine.server", ["aiohttp", "transformers"]) == ["aiohttp"]
