"""vLLM names its compile-cache directory after a hash of its environment (``compile_factors``):
two engines under ``weightcache artifacts-run`` each get a staging directory of their own as
``VLLM_CACHE_ROOT``, and if anything vLLM hashes were derived from it, a later engine would look for
its compiled graphs under another name than the entry copied in and compile everything again.
Computed by the installed vLLM itself, in a fresh process per engine, with one home directory, as
in an engine image (vLLM 0.26 hashes paths derived from HOME: ``VLLM_CONFIG_ROOT``,
``VLLM_XLA_CACHE_PATH``)."""

import os
import subprocess
import sys
from pathlib import Path

from weightcache.artifacts.engine import engine_env

HASH = "from vllm import envs; from vllm.config.utils import hash_factors; print(hash_factors(envs.compile_factors()))"


def compile_env_hash(environ: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-c", HASH], env=environ, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


def test_two_engines_with_different_staging_directories_hash_vllms_environment_alike(tmp_path: Path) -> None:
    base = {**os.environ, "HOME": str(tmp_path / "home")}
    first = {**base, **engine_env(tmp_path / "staging" / "a1", str(tmp_path), base)}
    second = {**base, **engine_env(tmp_path / "staging" / "b2", str(tmp_path), base)}
    assert first["VLLM_CACHE_ROOT"] != second["VLLM_CACHE_ROOT"]
    assert compile_env_hash(first) == compile_env_hash(second)
