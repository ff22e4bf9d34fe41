"""A real engine start, read through ``python -X importtime``: what the serving process imported.

tests/unit/data_plane/engine/test_engine_imports.py checks the modules at import; this checks the process itself,
from start through ``/ready``, a completion and a chat completion, so an import made lazily on
the way (in the warm-up, the first request, the tokenizer) is seen too.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_process import EngineFactory, engines

NEVER = ("transformers", "huggingface_hub", "vllm", "sympy", "triton", "torch._dynamo", "torch._inductor")


@pytest.fixture
def start_engine(tmp_path: Path) -> Iterator[EngineFactory]:
    yield from engines(tmp_path)


def imported(log: str) -> set[str]:
    """Every module named on an ``import time:`` line (``-X importtime`` writes one per import)."""
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", log, re.MULTILINE)}


def test_a_serving_engine_never_imports_transformers_vllm_or_torchs_compiler(llama, start_engine) -> None:
    engine = start_engine(llama, "--dtype", "float32", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert engine.complete("The weight cache", max_tokens=4)["usage"]["completion_tokens"] == 4
    chat = engine.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert chat.status == 200, chat.body
    assert engine.stop() == 0
    modules = imported(engine.output())
    assert {"torch", "aiohttp", "tokenizers"} <= modules, "the log holds no importtime lines: the check saw nothing"
    found = sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in NEVER))
    assert not found, f"the serving engine imported {found}; make that import lazy or drop it"
