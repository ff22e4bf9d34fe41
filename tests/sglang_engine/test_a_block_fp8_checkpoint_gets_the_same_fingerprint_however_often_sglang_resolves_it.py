"""The daemon fingerprints a block-FP8 checkpoint from SGLang's own view of it, in a process set up
as the daemon's rank is (SGLang's CPU engine, the kernel stand-in), where SGLang 0.5.17's resolved
quantization section holds the model's config itself (``hf_quant_config["hf_config"]``): the
fingerprint exists, is the same each time it is computed, and differs from the unquantized model's
(a digest that serialised that config through its ``repr`` would recurse into itself and fail)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_harness import ROOT, env, sglang_args
from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint

MOE = dict(
    family="qwen3_moe", hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512, moe_intermediate_size=128
)

# What the daemon's rank does before it loads: parse, publish, SGLang's model config, the refusals,
# the fingerprint; for each checkpoint on the command line, twice.
PREPARE = """
import json, sys
from weightcache.sglang.build import model_config_of, publish_rank
from weightcache.sglang.server_args import parse, refuse_quantization, refuse_unservable
from weightcache.sglang.stamp import rank_fingerprint

engine_args = json.loads(sys.argv[1])
digests = {}
for model in sys.argv[2:]:
    for _ in range(2):
        server_args = parse(model, engine_args)
        refuse_unservable(server_args, model, 1, 1)
        publish_rank(server_args, 0, 0, 0)
        model_config = model_config_of(server_args, 0)
        refuse_quantization(model_config)
        fingerprint = rank_fingerprint(server_args, model_config, 0, 0)
        digests.setdefault(model, []).append([fingerprint.quantization, fingerprint.digest])
print("DIGESTS " + json.dumps(digests))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fp8")
    return {
        "fp8": write_checkpoint(root / "fp8", ModelSpec(**MOE, fp8=True)),
        "bf16": write_checkpoint(root / "bf16", ModelSpec(**MOE)),
    }


def test_a_block_fp8_moe_is_fingerprinted_alike_each_time_and_apart_from_its_unquantized_twin(
    checkpoints: dict[str, Path], calls: Path
) -> None:
    fp8, bf16 = str(checkpoints["fp8"]), str(checkpoints["bf16"])
    done = subprocess.run(
        [sys.executable, "-c", PREPARE, json.dumps(sglang_args()), fp8, bf16],
        env=env(calls),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("DIGESTS "))
    digests = json.loads(line.removeprefix("DIGESTS "))

    (quantization, first), (_, again) = digests[fp8]
    assert quantization == "fp8"
    assert first == again
    assert first not in {digest for _, digest in digests[bf16]}
