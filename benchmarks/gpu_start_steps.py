"""Where a fresh engine's GPU start goes, step by step, in one process: a script, not a test.

Times, in the order an engine pays them, ``import torch``, aiohttp, the engine's own modules, the
CUDA driver's start and the primary context, the first bf16 matmul (cuBLAS), the first SDPA and
the checkpoint's tokenizer. ``overlap`` makes the context on a thread beside the imports, as
``weightcache engine`` does (``gpu_identity.start_primary_context``); ``serial`` makes it after.

    PYTHONPATH=contract:daemon_image python3 benchmarks/gpu_start_steps.py serial  CHECKPOINT_DIR
    PYTHONPATH=contract:daemon_image python3 benchmarks/gpu_start_steps.py overlap CHECKPOINT_DIR
"""

import sys
import threading
import time

T0 = time.perf_counter()
marks: list[tuple[str, float]] = []


def mark(step: str) -> None:
    marks.append((step, time.perf_counter() - T0))


def main() -> int:
    mode, model = sys.argv[1], sys.argv[2]
    if mode not in ("serial", "overlap"):
        raise SystemExit("usage: gpu_start_steps.py serial|overlap CHECKPOINT_DIR")
    thread = None
    if mode == "overlap":
        from weightcache.gpu.gpu_identity import start_primary_context

        thread = threading.Thread(target=start_primary_context, daemon=True)
        thread.start()
        mark("thread started")
    import torch

    mark("import torch")
    import aiohttp.web  # noqa: F401

    mark("import aiohttp")
    from weightcache.engine import rank  # noqa: F401

    mark("import engine.rank")
    if thread is not None:
        thread.join()
        mark("context thread joined")
    else:
        from weightcache.gpu.gpu_identity import gpu_count

        gpu_count()
        mark("cuInit (driver)")
    torch.cuda.set_device(0)
    mark("set_device (context)")
    x = torch.ones((64, 64), dtype=torch.bfloat16, device="cuda")
    (x @ x).sum().item()
    mark("first bf16 matmul (cuBLAS)")
    y = torch.ones((1, 16, 8, 128), dtype=torch.bfloat16, device="cuda")
    torch.nn.functional.scaled_dot_product_attention(y, y, y, is_causal=True).sum().item()
    mark("first sdpa")
    from weightcache.engine.tokenizer import Tokenizer

    Tokenizer(model)
    mark("tokenizer")
    previous = 0.0
    for step, at in marks:
        print(f"{mode:8} {step:30} {at:7.3f} s  (+{at - previous:.3f})")
        previous = at
    return 0


if __name__ == "__main__":
    sys.exit(main())
