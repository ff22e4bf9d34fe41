"""An engine profile's publish on a GPU: a model of N GiB of random bytes copied into a ``cuda-vmm``
arena, directly and through host memory (``engine_profiles/publish.py``), and the manifest's crc32s
of that arena summed on the publisher's thread pool (read back through pinned buffers) against one
thread reading each tensor back whole into pageable memory.

Run on the GPU machine (``python3 benchmarks/publish_gpu.py --gib 12``, with ``contract`` and
``daemon_image`` on ``PYTHONPATH``); ``--cpu`` runs the same on a ``cpu-shm`` arena. A script, not a
test: it prints one line per path and whether the three sets of checksums agree.
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn
from weightcache.checkpoints.staging import PinnedStaging
from weightcache.engine_profiles import publish as publishing


def model(gib: int, device: str) -> nn.Module:
    m = nn.Module()
    for i in range(gib):
        m.register_buffer(f"w{i}", torch.randint(0, 256, (2**30,), dtype=torch.uint8, device=device))
    m.register_buffer("tail", torch.randn(12345, device=device))
    return m


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=int, default=12)
    p.add_argument("--cpu", action="store_true")
    args = p.parse_args()
    device, backend = ("cpu", "cpu-shm") if args.cpu else ("cuda", "cuda-vmm")
    for through_host in (False, True) if not args.cpu else (False,):
        m = model(args.gib, device)
        if not args.cpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        published = publishing.publish(m, "digest", f"bench/{through_host}", backend, 0, through_host=through_host)
        publish_s = time.perf_counter() - t
        flat, entries = published.arena.buffer(), list(published.manifest.entries())
        t = time.perf_counter()
        one = [zlib.crc32(flat[e.offset : e.offset + e.nbytes].cpu().numpy().data) for e in entries]
        one_s = time.perf_counter() - t
        t = time.perf_counter()
        pinned = None if args.cpu else PinnedStaging(torch.device("cuda", 0))
        with ThreadPoolExecutor(max_workers=min(16, len(os.sched_getaffinity(0)))) as pool:
            pooled = [e.checksum for e in publishing.checksums(flat, entries, pool, pinned)]
        pooled_s = time.perf_counter() - t
        agree = one == pooled == [e.checksum for e in entries]
        print(
            f"{args.gib} GiB, through host memory: {through_host}: publish {publish_s:.1f} s; checksums on the pool "
            f"{pooled_s:.1f} s, one thread {one_s:.1f} s; the same: {agree}",
            flush=True,
        )
        published.arena.close()
        del m, published, flat
        if not args.cpu:
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
