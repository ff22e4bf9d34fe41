"""GPU backends on a real GPU: bit-exact outputs, read-only mappings, keeper re-adoption, shared memory.

Marked ``gpu``: skipped without CUDA, run on the device machine with ``make gpu``.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from weightcache.checkpoints.sharding import Layout
from weightcache.client.weights import DaemonConnection, expect, load_from_disk
from weightcache.tools.reference_hf import bound_hf_model, oracle_hf_model

pytestmark = pytest.mark.gpu
PROBE = str(Path(__file__).with_name("engine_probe.py"))
PROMPT = [3, 17, 101, 7, 250, 42, 9]
SPEC = dict(
    family="llama",
    hidden_size=1024,
    intermediate_size=2816,
    num_layers=6,
    num_heads=16,
    num_kv_heads=8,
    vocab_size=8192,
)


@pytest.fixture(scope="module")
def gpu_ckpt(checkpoint_factory) -> Path:
    return checkpoint_factory(**SPEC)


def digest_of(model) -> str:
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT], device="cuda")).logits
    torch.cuda.synchronize()
    return hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()


def probe(ckpt: Path, daemon, backend: str, action: str = "report", **popen) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, PROBE, str(ckpt), daemon.socket_dir, daemon.name, backend, action],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def report_of(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    return json.loads(line)


def status(daemon):
    with DaemonConnection(daemon.files[0].socket) as conn:
        return conn.status()


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_bound_model_is_bit_exact_with_disk_and_transformers(gpu_ckpt, start_daemon, backend: str) -> None:
    daemon = start_daemon(gpu_ckpt, backend=backend, dtype="bfloat16")
    st = status(daemon)
    assert st.backend == backend and st.device_uuid and st.device_uuid.startswith("GPU-")
    disk = load_from_disk(expect(str(gpu_ckpt), Layout(), dtype="bfloat16", backend=backend))
    assert next(iter(disk.tensors.values())).is_cuda
    want = digest_of(bound_hf_model(gpu_ckpt, disk))
    oracle = digest_of(oracle_hf_model(gpu_ckpt, "bfloat16").to("cuda"))
    assert want == oracle
    engine = probe(gpu_ckpt, daemon, backend)
    report = report_of(engine)
    assert engine.wait(timeout=120) == 0
    assert report["mode"] == "cache" and report["params_inside_arena"]
    assert report["digest"] == want
    assert report["device_uuid"] == st.device_uuid and report["bytes_mapped"] == st.arena_bytes


def test_write_through_a_read_only_mapping_kills_only_the_writer(gpu_ckpt, start_daemon) -> None:
    daemon = start_daemon(gpu_ckpt, backend="cuda-vmm", dtype="bfloat16")
    bystander = probe(gpu_ckpt, daemon, "cuda-vmm", "hold", stdin=subprocess.PIPE)
    before = report_of(bystander)["digest"]
    writer = probe(gpu_ckpt, daemon, "cuda-vmm", "write")
    assert report_of(writer)["mode"] == "cache"
    out, err = writer.communicate(timeout=120)
    assert writer.returncode != 0 and '"wrote": true' not in out, (out, err)
    # The daemon and the other engine saw nothing.
    bystander.stdin.write("again\n")
    bystander.stdin.flush()
    assert json.loads(bystander.stdout.readline())["digest"] == before
    bystander.kill()
    fresh = probe(gpu_ckpt, daemon, "cuda-vmm")
    assert report_of(fresh)["digest"] == before and fresh.wait(timeout=120) == 0
    assert daemon.proc.poll() is None


def test_daemon_sigkill_engine_keeps_serving_and_keeper_readopts_without_disk(
    gpu_ckpt, start_keeper, start_daemon, lean_env
) -> None:
    start_keeper()
    daemon = start_daemon(gpu_ckpt, backend="cuda-vmm", dtype="bfloat16")
    deadline = time.monotonic() + 60
    while not status(daemon).deposited:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    engine = probe(gpu_ckpt, daemon, "cuda-vmm", "hold", stdin=subprocess.PIPE)
    before = report_of(engine)["digest"]
    assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    engine.stdin.write("again\n")
    engine.stdin.flush()
    assert json.loads(engine.stdout.readline())["digest"] == before
    engine.kill()

    # Re-adoption neither imports torch nor creates a CUDA context (arena.HeldFdArena).
    again = start_daemon(gpu_ckpt, backend="cuda-vmm", dtype="bfloat16", env=lean_env)
    st = status(again)
    assert st.adopted and st.disk_bytes_read == 0
    print(f"re-adoption: {again.files[0].read_ready().load_seconds * 1000:.1f} ms")
    fresh = probe(gpu_ckpt, again, "cuda-vmm")
    assert report_of(fresh)["digest"] == before and fresh.wait(timeout=120) == 0


def test_two_engines_map_one_arena_without_copies(checkpoint_factory, start_daemon) -> None:
    ckpt = checkpoint_factory(
        family="llama",
        hidden_size=2048,
        intermediate_size=5632,
        num_layers=24,
        num_heads=16,
        num_kv_heads=8,
        vocab_size=8192,
        tokenizer=False,
    )
    daemon = start_daemon(ckpt, backend="cuda-vmm", dtype="bfloat16")
    arena = status(daemon).arena_bytes
    assert arena > 2 * 2**30
    free0, total = torch.cuda.mem_get_info()
    engines = [probe(ckpt, daemon, "cuda-vmm", "hold", stdin=subprocess.PIPE) for _ in range(2)]
    reports = [report_of(e) for e in engines]
    free2, _ = torch.cuda.mem_get_info()
    growth = free0 - free2
    for e in engines:
        e.kill()
    print(
        f"arena {arena / 2**30:.2f} GiB; two engines grew device use by {growth / 2**30:.2f} GiB "
        f"(their own allocations: {[r['allocated'] for r in reports]})"
    )
    assert all(r["params_inside_arena"] for r in reports)
    # Each engine costs its CUDA context and activations; a copy of the weights would add 2 × arena.
    assert growth < arena, (growth, arena)


def test_gpu_identity_without_torch_agrees_with_torch() -> None:
    """The driver-API facts (daemon side, torch-free) and torch's view (engine side) must format
    identically, or fingerprints and UUID lookups would disagree between the two."""
    from weightcache.gpu.gpu_identity import gpu_count, gpu_facts, ordinal_for_uuid, torch_build

    assert gpu_count() == torch.cuda.device_count()
    for ordinal in range(gpu_count()):
        props = torch.cuda.get_device_properties(ordinal)
        facts = gpu_facts(ordinal)
        assert facts.uuid == f"GPU-{props.uuid}"
        assert (facts.name, facts.compute_capability) == (props.name, f"{props.major}.{props.minor}")
        assert ordinal_for_uuid(facts.uuid) == ordinal
    assert torch_build() == (torch.__version__.split("+")[0], torch.version.cuda)


def test_engine_finds_the_gpu_by_uuid_whatever_its_numbering(gpu_ckpt, start_daemon) -> None:
    daemon = start_daemon(gpu_ckpt, backend="cuda-vmm", dtype="bfloat16")
    uuid = status(daemon).device_uuid
    by_uuid = probe(gpu_ckpt, daemon, "cuda-vmm", env={**os.environ, "CUDA_VISIBLE_DEVICES": uuid})
    assert report_of(by_uuid)["device_uuid"] == uuid and by_uuid.wait(timeout=120) == 0
    hidden = probe(gpu_ckpt, daemon, "cuda-vmm", env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    out, err = hidden.communicate(timeout=120)
    assert hidden.returncode != 0 and "sees no CUDA device" in err, err


def test_free_memory_report_agrees_with_cuda_and_sees_a_daemons_arena(gpu_ckpt, start_daemon) -> None:
    """NVML (read by the status endpoint without a CUDA context) and the CUDA runtime count the
    same device memory; a daemon's load shows up in it, which is what the blue/green decision
    weighs a second copy against."""
    from weightcache.daemon.status_endpoint import collect
    from weightcache.gpu.device_memory import gpu_memory

    uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
    torch.cuda.synchronize()
    cuda_free, cuda_total = torch.cuda.mem_get_info(0)
    nvml = gpu_memory(uuid)
    assert nvml.error is None and nvml.total_bytes == cuda_total, nvml
    assert abs((nvml.free_bytes or 0) - cuda_free) < 64 << 20, (nvml, cuda_free)
    daemon = start_daemon(gpu_ckpt, backend="cuda-vmm", dtype="bfloat16")
    report = collect(daemon.socket_dir, daemon.name, [0], lambda _rank: None)
    rank = report.ranks[0]
    assert rank.ready and rank.gpu_uuid == uuid and rank.bytes
    assert [m.device for m in report.memory] == ["host", uuid]
    after = report.memory[1]
    # The arena (and the daemon's CUDA context) now occupy the device.
    assert after.free_bytes is not None and after.free_bytes <= (nvml.free_bytes or 0) - rank.bytes, (after, nvml, rank)
