"""An engine process for the GPU tests: map a cache, bind a transformers model, report logits.

Runs as its own process because legacy CUDA IPC cannot be opened by the process that exported
it, and because a faulting write must kill this process, not the test runner.
"""

import hashlib
import json
import sys

import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import load_weights
from weightcache.tools.reference_hf import bound_hf_model

PROMPT = [3, 17, 101, 7, 250, 42, 9]


def logits_digest(model) -> str:
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT], device="cuda")).logits
    torch.cuda.synchronize()
    return hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()


def main() -> None:
    model_dir, socket_dir, name, backend, action = sys.argv[1:6]
    dtype = sys.argv[6] if len(sys.argv) > 6 else "bfloat16"
    weights = load_weights(
        model_dir, Layout(), socket_dir=socket_dir, name=name, fallback="error", dtype=dtype, backend=backend
    )
    model = bound_hf_model(model_dir, weights)
    lo, hi = weights.arena.address_range
    inside = all(lo <= p.data_ptr() < hi for p in model.parameters())
    report = {
        "mode": weights.mode,
        "digest": logits_digest(model),
        "params_inside_arena": inside,
        "bytes_mapped": weights.bytes_mapped,
        "device_uuid": weights.device_uuid,
        "allocated": torch.cuda.memory_allocated(),
    }
    print(json.dumps(report), flush=True)
    if action == "write":
        next(iter(weights.tensors.values())).fill_(0)
        torch.cuda.synchronize()
        print(json.dumps({"wrote": True}), flush=True)
    elif action == "hold":
        for _ in sys.stdin:
            print(json.dumps({"digest": logits_digest(model)}), flush=True)


if __name__ == "__main__":
    main()
