"""Which FP8 layers a vLLM without the "weights already processed" mode may replay post-processing
on: the decision is made on the methods vLLM built, by the kernel each chose. Here vLLM builds a
block-FP8 Qwen3-MoE on this CPU, where its FP8 kernels pack the weights for the CPU: none of its FP8
linear or MoE layers is replayable, on either platform's list, while the attention layers' KV-cache
method and the layers the checkpoint keeps unquantized (the router) are on the GPU's list. (On a
Hopper GPU with VLLM_USE_DEEP_GEMM=0 vLLM chooses CUTLASS and Triton, which are: docs/benchmarks.md.)
vLLM's model construction on the meta device, in a process of its own; no weight is loaded."""

import json
import subprocess
import sys
from pathlib import Path

from vllm_harness import env, qwen3_moe_checkpoint, vllm_args

BUILD = """
import json, socket, sys, torch
from vllm.config import set_current_vllm_config
from vllm.model_executor.model_loader.utils import initialize_model
from weightcache.vllm import versions
from weightcache.vllm.build import join_rank_group
from weightcache.vllm.engine_args import engine_config

config = engine_config(sys.argv[1], json.loads(sys.argv[2]), 1, 1)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
join_rank_group(config, 0, f"tcp://127.0.0.1:{port}")
with set_current_vllm_config(config), torch.device("meta"):
    model = initialize_model(vllm_config=config, model_config=config.model_config)
print("LAYERS " + json.dumps({
    name: [type(m.quant_method).__name__, versions.replay_kernel(m.quant_method),
           versions.replayable(m.quant_method, "cuda"), versions.replayable(m.quant_method, "cpu")]
    for name, m in model.named_modules() if getattr(m, "quant_method", None) is not None
}))
"""


def test_cpu_packed_fp8_kernels_are_never_replayed_and_the_kv_method_and_router_are(tmp_path: Path) -> None:
    model = qwen3_moe_checkpoint(tmp_path / "fp8-moe", fp8=True)
    out = subprocess.run(
        [sys.executable, "-c", BUILD, str(model), json.dumps(vllm_args())],
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("LAYERS ")), None)
    assert line is not None, out.stderr[-4000:]
    layers = json.loads(line.removeprefix("LAYERS "))
    attention = layers["model.layers.0.self_attn.qkv_proj"]
    experts = next(v for k, v in layers.items() if k.startswith("model.layers.0.mlp.experts"))
    assert attention[:2] == ["Fp8LinearMethod", "CPUFp8BlockScaledMMKernel"] and attention[2:] == [False, False]
    assert experts[0] == "Fp8MoEMethod" and experts[1] == "CPU" and experts[2:] == [False, False]
    assert layers["model.layers.0.self_attn.attn"] == ["Fp8KVCacheMethod", None, True, False]
    assert layers["model.layers.0.mlp.gate"] == ["UnquantizedLinearMethod", None, True, False]
