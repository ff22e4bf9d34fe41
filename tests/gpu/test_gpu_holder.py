"""Blue/green on a GPU: a GPU holder books the GPU, two daemon generations keep weights on it.

Real processes on a real GPU: ``weightcache gpu-holder`` writes the grant as a holder pod would
(``NVIDIA_VISIBLE_DEVICES`` set to its GPUs, as the device plugin sets it); two daemons of two
generations (bfloat16 and float16: two fingerprints), each with ``--gpus-file`` and its own socket
directory, load next to each other on the granted GPU; an engine maps from each. Then the first
generation stops and the second keeps serving; and the readiness probe turns a rank unready when
the holder stops or no longer grants its GPU.

Marked ``gpu``: skipped without CUDA, run on the device machine with ``make gpu``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from weightcache.client.weights import DaemonConnection
from weightcache.daemon.probe import probe
from weightcache.gpu.device_memory import gpu_memory, nvml_gpu_uuids
from weightcache.gpu.gpu_grant import Grant, current_grant, take_lock, write_grant

pytestmark = pytest.mark.gpu
PROBE = str(Path(__file__).with_name("engine_probe.py"))
# ~0.4 B parameters: a 0.77 GiB arena in 16 bits, large enough to see next to CUDA contexts.
SPEC = dict(
    family="llama",
    hidden_size=2048,
    intermediate_size=5632,
    num_layers=8,
    num_heads=16,
    num_kv_heads=8,
    vocab_size=8192,
    tokenizer=False,
)
CONTEXT_ALLOWANCE = 2 << 30
"""What a second daemon may cost beyond its arena: its CUDA context and allocator rounding."""


def engine(ckpt: Path, socket_dir: str, backend: str, dtype: str) -> dict:
    proc = subprocess.run(
        [sys.executable, PROBE, str(ckpt), socket_dir, "tiny", backend, "report", dtype],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[0])


def status(socket_dir: str):
    from weightcache.wire.rankfiles import RankFiles

    with DaemonConnection(RankFiles(socket_dir, "tiny", 0).socket) as conn:
        return conn.status()


def free_bytes(uuid: str) -> int:
    torch.cuda.synchronize()
    memory = gpu_memory(uuid)
    assert memory.free_bytes is not None, memory
    return memory.free_bytes


@pytest.fixture
def holder(socket_dir: str, tmp_path: Path):
    """``weightcache gpu-holder`` given every GPU here, as the device plugin would give them; its
    grant in ``socket_dir``, the per-cache directory (short: socket paths go below it)."""
    grant = Path(socket_dir) / "gpus.json"
    gpus = nvml_gpu_uuids()
    log = tmp_path / "holder.log"
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": ",".join(gpus), "POD_NAME": "tiny-gpus-test", "NODE_NAME": "here"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "weightcache", "gpu-holder", "--out", str(grant), "--expect", str(len(gpus))],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while current_grant(grant)[0] is None:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    yield proc, grant
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_two_generations_share_the_holders_gpu_and_the_second_outlives_the_first(
    checkpoint_factory, start_daemon, holder, backend: str
) -> None:
    ckpt = checkpoint_factory(**SPEC)
    holder_proc, grant_file = holder
    grant, _ = current_grant(grant_file)
    assert grant is not None and grant.pod == "tiny-gpus-test" and grant.node == "here"
    uuid = grant.uuids[0]
    assert uuid in {f"GPU-{torch.cuda.get_device_properties(i).uuid}" for i in range(torch.cuda.device_count())}
    root = grant_file.parent  # the per-cache directory: gpus.json and one socket directory per generation
    blue, green = str(root / "g1"), str(root / "g2")
    common = {"backend": backend, "keeper": "off", "ranks": [0], "gpus_file": str(grant_file)}
    env = {**os.environ, "NVIDIA_VISIBLE_DEVICES": "all"}

    free0 = free_bytes(uuid)
    old = start_daemon(ckpt, **common, dtype="bfloat16", name="tiny", socket_dir_override=blue, env=env)
    assert "using the GPU the holder booked" in old.output()
    free1 = free_bytes(uuid)
    new = start_daemon(ckpt, **common, dtype="float16", name="tiny", socket_dir_override=green, env=env)
    free2 = free_bytes(uuid)
    a, b = status(blue), status(green)
    assert a.device_uuid == b.device_uuid == uuid, "both generations hold their arenas on the granted GPU"
    assert a.fingerprint_digest != b.fingerprint_digest
    drop = free1 - free2
    print(
        f"{backend}: arena {b.arena_bytes / 2**30:.2f} GiB; free {free0 / 2**30:.2f} → {free1 / 2**30:.2f} "
        f"→ {free2 / 2**30:.2f} GiB (second generation took {drop / 2**30:.2f} GiB)"
    )
    assert b.arena_bytes <= drop <= b.arena_bytes + CONTEXT_ALLOWANCE, (drop, b.arena_bytes)
    assert probe(blue, "tiny", [0], gpus_file=str(grant_file)) == []
    assert probe(green, "tiny", [0], gpus_file=str(grant_file)) == []

    from_old, from_new = engine(ckpt, blue, backend, "bfloat16"), engine(ckpt, green, backend, "float16")
    for report, st in ((from_old, a), (from_new, b)):
        assert report["mode"] == "cache" and report["params_inside_arena"], report
        assert report["device_uuid"] == uuid and report["bytes_mapped"] == st.arena_bytes
    assert from_old["digest"] != from_new["digest"], "two dtypes, two sets of weights"

    assert old.stop(signal.SIGTERM) == 0
    deadline = time.monotonic() + 10  # the driver frees a context as its process is torn down
    while (free3 := free_bytes(uuid)) - free2 < a.arena_bytes and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"{backend}: first generation stopped, free {free3 / 2**30:.2f} GiB")
    assert free3 - free2 >= a.arena_bytes, "the first generation's arena went with it"
    again = engine(ckpt, green, backend, "float16")
    assert again["mode"] == "cache" and again["digest"] == from_new["digest"]
    assert new.proc.poll() is None and probe(green, "tiny", [0], gpus_file=str(grant_file)) == []

    # Readiness follows the booking: the holder gone, or a grant without this GPU.
    holder_proc.send_signal(signal.SIGTERM)
    assert holder_proc.wait(timeout=30) == 0
    problems = probe(green, "tiny", [0], gpus_file=str(grant_file))
    assert len(problems) == 1 and "no GPU holder runs" in problems[0] and uuid in problems[0], problems
    assert probe(green, "tiny", [0]) == [], "without the grant check the rank itself is fine"
    fd = take_lock(grant_file, "restarted")
    try:
        other = "GPU-00000000-1111-2222-3333-444444444444"
        write_grant(grant_file, Grant(uuids=(other,), token="restarted", pod="tiny-gpus-next"))
        problems = probe(green, "tiny", [0], gpus_file=str(grant_file))
        assert len(problems) == 1 and "no longer granted" in problems[0] and "tiny-gpus-next" in problems[0], problems
    finally:
        os.close(fd)
    assert engine(ckpt, green, backend, "float16")["digest"] == from_new["digest"], "serving never depended on it"
