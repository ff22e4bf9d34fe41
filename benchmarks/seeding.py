"""Seeding: a rank copied from a peer daemon's arena against the same rank loaded from disk.

On this machine (loopback TCP between two daemons; host arenas, or GPU arenas with ``--backend
cuda-vmm``, where both daemons hold theirs on GPU 0 and each chunk passes a pinned host buffer), with a generated llama checkpoint
of ``--gib`` GiB (bf16, TP=1):

- the daemon's load from disk, cold page cache (posix_fadvise DONTNEED first) and warm;
- a second daemon seeded from the first (``--seed-streams`` connections, no cap): seconds, MiB/s,
  checkpoint bytes read (0 expected);
- the same seed under a serving cap (``--cap-mib-s``), which is what a production peer runs with;
- the seeding peer's answer time to engines while it seeds (status requests on its Unix socket,
  p50/p99) against while idle: the cost of seeding to the engines it serves.

With ``--profile vllm`` the daemons are ``--profile vllm`` ones on a generated Qwen3 (vLLM's CPU
build, ``cpu-shm``): the load is vLLM's loading and post-processing, which a seeded rank skips;
each row also gives the daemon's start-to-ready time (vLLM's import and config included on both).

Prints one table; asserts nothing.

    PYTHONPATH=contract:daemon_image python benchmarks/seeding.py            # ~1 GiB
    PYTHONPATH=contract:daemon_image python benchmarks/seeding.py --gib 4 --workdir /var/tmp/wc-seed
    PYTHONPATH=contract:daemon_image python benchmarks/seeding.py --profile vllm --gib 0.5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from weightcache.checkpoints.page_cache import drop_page_cache
from weightcache.client.weights import DaemonConnection
from weightcache.tools.bench import _table
from weightcache.tools.sample_checkpoints import ModelSpec, write_checkpoint
from weightcache.wire.protocol import StatusReply
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.launch import DaemonArgs
from weightcache_contract.seeding import SeedPeer, SeedPeers

MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


ENGINE_ARGS = [
    "--dtype",
    "bfloat16",
    "--max-model-len",
    "256",
    "--enforce-eager",
    "--kv-cache-memory-bytes",
    str(64 * MIB),
]
"""What the daemon of ``--profile vllm`` is given (TP=1 on this CPU)."""


class Daemon:
    def __init__(self, workdir: Path, node: str, args: DaemonArgs) -> None:
        self.files = RankFiles(args.socket_dir, args.name, 0)
        self.log = workdir / f"{node}.log"
        argv = [sys.executable, "-m", "weightcache", "daemon", *args.to_argv()]
        env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        began = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdout=self.log.open("w"), stderr=subprocess.STDOUT, env=env)
        while self.files.read_ready() is None:
            if self.proc.poll() is not None:
                raise SystemExit(f"{node} exited:\n{self.log.read_text()}")
            time.sleep(0.02)
        self.ready_s = time.perf_counter() - began

    def status(self) -> StatusReply:
        with DaemonConnection(self.files.socket) as conn:
            return conn.status()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def answer_times(daemon: Daemon, until: threading.Event, out: list[float]) -> None:
    with DaemonConnection(daemon.files.socket) as conn:
        while not until.is_set():
            began = time.perf_counter()
            conn.status()
            out.append((time.perf_counter() - began) * 1000)
            time.sleep(0.005)


def percentiles(samples: list[float]) -> str:
    if len(samples) < 2:
        return "n/a"
    cuts = statistics.quantiles(samples, n=100)
    return f"p50 {cuts[49]:.2f} ms, p99 {cuts[98]:.2f} ms ({len(samples)} requests)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--seed-streams", type=int, default=4)
    parser.add_argument("--cap-mib-s", type=float, default=500.0)
    parser.add_argument("--backend", default="cpu-shm", help="cpu-shm, or cuda-vmm (both daemons on GPU 0)")
    parser.add_argument("--profile", default="reference", choices=["reference", "vllm"])
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="wc-seed-"))
    workdir.mkdir(parents=True, exist_ok=True)
    layers = max(1, round(8 * args.gib / 0.8))
    spec = ModelSpec(hidden_size=2048, intermediate_size=5632, num_layers=layers, num_heads=16, num_kv_heads=8)
    if args.profile == "vllm":  # a head size vLLM's CPU attention supports (64)
        spec = ModelSpec(
            family="qwen3", hidden_size=2048, intermediate_size=5632, num_layers=layers, num_heads=32, num_kv_heads=8
        )
    vllm = {"profile": "vllm", "engine_args": tuple(ENGINE_ARGS)} if args.profile == "vllm" else {"dtype": "bfloat16"}
    model = workdir / ("model" if args.profile == "reference" else "model-vllm")
    if not (model / "config.json").exists():
        write_checkpoint(model, spec)
    key = workdir / "credential"
    key.write_bytes(os.urandom(32))
    key.chmod(0o600)
    port = free_port()

    def daemon(node: str, **extra: object) -> Daemon:
        return Daemon(
            workdir,
            node,
            DaemonArgs(
                model=str(model),
                socket_dir=str(workdir / node),
                name="bench",
                backend=args.backend,
                keeper="off",
                checkpoint_poll_seconds=0,
                seed_credential_file=str(key),
                node_name=node,
                **vllm,  # type: ignore[arg-type]
                **extra,  # type: ignore[arg-type]
            ),
        )

    rows: list[tuple[str, str]] = []
    drop_page_cache(model)
    peer = daemon("node-a", seed_listen=f"127.0.0.1:{port}")
    st = peer.status()
    size = st.arena_bytes
    rows.append(("arena", f"{size / 2**30:.2f} GiB ({st.tensor_count} tensors)"))
    rows.append(
        (
            "disk, cold page cache",
            f"{st.load_seconds:.2f} s ({size / MIB / st.load_seconds:.0f} MiB/s); ready in {peer.ready_s:.1f} s",
        )
    )
    warm = daemon("node-w")
    wst = warm.status()
    warm.stop()
    rows.append(
        (
            "disk, warm page cache",
            f"{wst.load_seconds:.2f} s ({size / MIB / wst.load_seconds:.0f} MiB/s); ready in {warm.ready_s:.1f} s",
        )
    )

    peers = workdir / "peers.json"
    peers.write_text(
        SeedPeers(
            peers=[SeedPeer(node="node-a", address="127.0.0.1", port=port, ranks={0: st.weights_digest})]
        ).model_dump_json()
    )
    idle: list[float] = []
    stop = threading.Event()
    sampler = threading.Thread(target=answer_times, args=(peer, stop, idle))
    sampler.start()
    time.sleep(2)
    stop.set()
    sampler.join()
    rows.append(("peer answers engines, idle", percentiles(idle)))

    for label, cap in (
        (f"seed, {args.seed_streams} streams, no cap", 0.0),
        (f"seed, capped at {args.cap_mib_s:.0f} MiB/s", args.cap_mib_s),
    ):
        peer.stop()
        peer = daemon("node-a", seed_listen=f"127.0.0.1:{port}", seed_max_mib_s=cap)
        busy: list[float] = []
        stop = threading.Event()
        sampler = threading.Thread(target=answer_times, args=(peer, stop, busy))
        sampler.start()
        node = f"node-b{int(cap)}"
        seeded = daemon(node, seed_peers_file=str(peers), seed_streams=args.seed_streams)
        stop.set()
        sampler.join()
        sst = seeded.status()
        seed = sst.seed
        assert seed is not None
        if seed.peer is None:
            raise SystemExit(f"the seed fell back to the disk: {seed.fallback}")
        rows.append(
            (
                label,
                f"{seed.seconds:.2f} s ({size / MIB / seed.seconds:.0f} MiB/s), checkpoint bytes read "
                f"{sst.disk_bytes_read}; ready in {seeded.ready_s:.1f} s",
            )
        )
        rows.append(
            (f"peer answers engines while it seeds ({'no cap' if not cap else f'{cap:.0f} MiB/s'})", percentiles(busy))
        )
        seeded.stop()
    peer.stop()
    print(
        f"\nmachine: {os.cpu_count()} cores; loopback TCP; {args.backend} arenas; profile {args.profile}; "
        f"checkpoint {model}"
    )
    _table(rows)


if __name__ == "__main__":
    main()
