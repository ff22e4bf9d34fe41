"""vLLM names its compile-cache directory after a hash of its environment (``compile_factors``):
two engines under ``weightcache artifacts-run`` each get a staging directory of their own as
``VLLM_CACHE_ROOT``, and if anything vLLM hashes were derived from it, a later engine would look for
its compiled graphs under another name than the entry copied in and compile everything again.
Computed by the installed vLLM itself, with one home directory, as in an engine image (vLLM 0.26
hashes paths derived from HOME: ``VLLM_CONFIG_ROOT``, ``VLLM_XLA_CACHE_PATH``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from weightcache.artifacts.engine import engine_env
from weightcache_contract.launch import VLLM_PROFILE

# vLLM reads each factor from os.environ when asked, so one process hashes both environments.
HASHES = """
import json, os, sys
from vllm import envs
from vllm.config.utils import hash_factors
for environ in json.load(sys.stdin):
    os.environ.clear()
    os.environ.update(environ)
    print(hash_factors(envs.compile_factors()))
"""


def test_two_engines_with_different_staging_directories_hash_vllms_environment_alike(tmp_path: Path) -> None:
    base = {**os.environ, "HOME": str(tmp_path / "home")}
    first = {**base, **engine_env(tmp_path / "staging" / "a1", str(tmp_path), VLLM_PROFILE, base)}
    second = {**base, **engine_env(tmp_path / "staging" / "b2", str(tmp_path), VLLM_PROFILE, base)}
    # Not vacuous: a factor vLLM hashes, set apart, makes the two differ.
    flipped = "0" if first.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") == "1" else "1"
    changed = {**first, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": flipped}
    assert first["VLLM_CACHE_ROOT"] != second["VLLM_CACHE_ROOT"]
    out = subprocess.run(
        [sys.executable, "-c", HASHES],
        input=json.dumps([first, second, changed]),
        env=base,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    hashes = out.stdout.strip().splitlines()[-3:]
    assert hashes[0] == hashes[1]
    assert hashes[2] != hashes[0]
