"""Checkpoint content digest: what hashing the bytes a rank reads costs (checkpoints/content.py).

Measures, on this machine:

- the candidate hashes in memory, one thread (hashlib's SHA-256, BLAKE2b, SHA-1): which is fastest;
- ``digest_shard`` verifying a generated shard of ``--gib`` GiB: warm page cache (CPU bound) and
  cold (posix_fadvise DONTNEED first: disk bound), against a plain read of the same file;
- the daemon's loader filling a host arena from a generated ~1 GiB llama checkpoint, warm page
  cache, with and without hashing as it reads (``fill(digests=...)``, 4 workers): the load-time cost.

Prints one table; asserts nothing.

    PYTHONPATH=contract:daemon_image python benchmarks/digest.py              # 3 GiB shard
    PYTHONPATH=contract:daemon_image python benchmarks/digest.py --gib 1 --workdir /var/tmp/wc-digest
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from weightcache.checkpoints.checkpoint import TensorInfo, open_checkpoint, stamp_file
from weightcache.checkpoints.content import CHUNK_BYTES, ReadDigests, digest_shard
from weightcache.checkpoints.page_cache import drop_page_cache
from weightcache.checkpoints.read_tasks import ReadTask
from weightcache.tools.bench import _table
from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint

GIB = 2**30
BLOCK = 64 * 2**20


def write_shard(path: Path, nbytes: int) -> TensorInfo:
    """A safetensors file holding one uint8 tensor of ``nbytes`` random-looking bytes."""
    header = json.dumps({"w": {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    block = os.urandom(BLOCK)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        for done in range(0, nbytes, BLOCK):
            # Each block differs (its index prefixed), so no layer below can deduplicate them.
            fh.write((done.to_bytes(8, "little") + block[8:])[: min(BLOCK, nbytes - done)])
        fh.flush()
        os.fsync(fh.fileno())
    return TensorInfo("w", path.name, "uint8", (nbytes,), 8 + len(header))


def in_memory(name: str, rounds: int = 8) -> float:
    buffer = os.urandom(BLOCK)
    h = hashlib.new(name)
    started = time.perf_counter()
    for _ in range(rounds):
        h.update(buffer)
    return rounds * BLOCK / GIB / (time.perf_counter() - started)


def plain_read(path: Path) -> float:
    buffer = bytearray(CHUNK_BYTES)
    started = time.perf_counter()
    with path.open("rb", buffering=0) as fh:
        while fh.readinto(buffer):
            pass
    return path.stat().st_size / GIB / (time.perf_counter() - started)


def verify(path: Path, info: TensorInfo) -> float:
    task = ReadTask("w", None, 0, info.shape[0], "raw", ("w",), info.shape[0])
    started = time.perf_counter()
    digest = digest_shard(path, stamp_file(path), {"w": info}, [task])
    assert digest is not None
    return info.shape[0] / GIB / (time.perf_counter() - started)


def load(ckpt_dir: Path, hashed: bool, rounds: int) -> tuple[float, int]:
    """Median seconds of the loader filling a host arena (warm page cache), and bytes read."""
    import torch
    from weightcache.checkpoints.loader import fill
    from weightcache.checkpoints.pipeline import plan_rank
    from weightcache.checkpoints.quantization import resolve
    from weightcache.checkpoints.sharding import Layout

    times = []
    for _ in range(rounds):
        ckpt = open_checkpoint(ckpt_dir)
        plan = plan_rank(ckpt, Layout(), resolve("none", None, None), "bfloat16")
        arena = torch.empty(plan.arena_bytes, dtype=torch.uint8)
        started = time.perf_counter()
        fill(ckpt, plan, arena, None, workers=4, digests=ReadDigests() if hashed else None)
        times.append(time.perf_counter() - started)
        ckpt.close()
    return statistics.median(times), plan.read_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=3.0, help="size of the generated shard")
    parser.add_argument("--workdir", default=None, help="where to write it (default: a temporary directory)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="wc-digest-", dir=args.workdir) as work:
        root = Path(work)
        rows: list[tuple[str, str]] = []
        for name in ("sha256", "blake2b", "sha1"):
            rate = statistics.median(in_memory(name) for _ in range(args.rounds))
            rows.append((f"{name} in memory, 1 thread", f"{rate:.2f} GiB/s"))
        print(f"writing a {args.gib:g} GiB shard ...", file=sys.stderr)
        shard = root / "shard.safetensors"
        info = write_shard(shard, int(args.gib * GIB))
        warm = statistics.median(verify(shard, info) for _ in range(args.rounds))
        rows.append((f"digest_shard, {args.gib:g} GiB, warm page cache", f"{warm:.2f} GiB/s"))
        drop_page_cache(shard)
        read_cold = plain_read(shard)
        drop_page_cache(shard)
        verify_cold = verify(shard, info)
        rows.append((f"plain read, {args.gib:g} GiB, cold page cache", f"{read_cold:.2f} GiB/s"))
        rows.append((f"digest_shard, {args.gib:g} GiB, cold page cache", f"{verify_cold:.2f} GiB/s"))
        shard.unlink()

        print("writing a llama checkpoint ...", file=sys.stderr)
        spec = ModelSpec(hidden_size=2048, intermediate_size=5632, num_layers=8, num_heads=16, num_kv_heads=8)
        ckpt_dir = write_checkpoint(root / "llama", spec)
        for path in ckpt_dir.glob("*.safetensors"):
            path.read_bytes()  # warm the page cache
        plain, nbytes = load(ckpt_dir, False, args.rounds)
        hashed, _ = load(ckpt_dir, True, args.rounds)
        rows.append((f"loader fill, {nbytes / GIB:.2f} GiB, warm, 4 workers", f"{nbytes / GIB / plain:.2f} GiB/s"))
        rows.append(
            (
                "loader fill + sha256 as it reads",
                f"{nbytes / GIB / hashed:.2f} GiB/s (+{(hashed - plain) / plain:.0%} time)",
            )
        )
        rows.append(("machine", f"{os.cpu_count()} CPUs, Python {sys.version.split()[0]}"))
        _table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
