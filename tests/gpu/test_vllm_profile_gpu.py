"""The ``vllm`` profile's GPU path without vLLM: a model's tensors published from the GPU into a
cuda-vmm arena, handed across ``exec`` to the torch-free serving daemon (same pid, the publisher's
CUDA context gone), mapped and bound by another process, and re-adopted from the keeper after a
SIGKILL.

Marked ``gpu``: skipped without CUDA, run on the device machine with ``make gpu``.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gpu_handoff_publisher import Tiny, fingerprint, model
from weightcache.client.weights import DaemonConnection, map_fingerprint
from weightcache.daemon.keeper import KeeperClient, keeper_socket
from weightcache.engine_profiles.bind import bind_arena, check_bound, outside_mapping
from weightcache.wire.rankfiles import RankFiles

pytestmark = pytest.mark.gpu
PUBLISHER = str(Path(__file__).with_name("gpu_handoff_publisher.py"))
NAME = "vllm-gpu"
IDS = torch.tensor([[3, 17, 101, 7, 250, 42, 9]])


def wait_for(condition, timeout: float = 120, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
    return value


def start_publisher(checkpoint: Path, socket_dir: str, log: Path) -> tuple[subprocess.Popen[bytes], object]:
    """Run the publisher; returns it and the ready file of the daemon it became."""
    files = RankFiles(socket_dir, NAME, 0)
    proc = subprocess.Popen(
        [sys.executable, PUBLISHER, str(checkpoint), socket_dir, NAME],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def ready():
        info = files.read_ready()
        if info is not None and info.pid == proc.pid:
            return info
        if proc.poll() is not None:
            raise AssertionError(f"publisher exited {proc.returncode}:\n{log.read_text()}")
        return None

    return proc, wait_for(ready, what="the handed-over daemon's ready file")


def status(socket_dir: str):
    with DaemonConnection(RankFiles(socket_dir, NAME, 0).socket) as conn:
        return conn.status()


def bound_model(checkpoint: Path, socket_dir: str):
    """Another process's view: map the arena with the client and bind it onto a meta-device model."""
    weights = map_fingerprint(fingerprint(str(checkpoint)), 0, socket_dir, NAME, backend="cuda-vmm")
    assert weights.manifest is not None
    with torch.device("meta"):
        target = Tiny()
    bound = bind_arena(target, weights.tensors, weights.manifest.kinds_by_name(), weights.aliases)
    check_bound(target)
    return target, weights, bound


def forward(net: torch.nn.Module) -> torch.Tensor:
    with torch.inference_mode():
        out = net(IDS.to("cuda:0"))
    torch.cuda.synchronize()
    return out


def test_a_gpu_published_arena_is_served_across_exec_bound_zero_copy_and_readopted_after_sigkill(
    llama: Path, socket_dir: str, start_keeper, tmp_path: Path
) -> None:
    start_keeper()
    torch.cuda.set_device(0)
    free_before, _ = torch.cuda.mem_get_info(0)
    proc, ready = start_publisher(llama, socket_dir, tmp_path / "publisher.log")
    try:
        files = RankFiles(socket_dir, NAME, 0)
        uuid = f"GPU-{torch.cuda.get_device_properties(0).uuid}"
        assert (ready.backend, ready.device_uuid, ready.adopted) == ("cuda-vmm", uuid, False)
        assert files.lock_is_held()
        # The exec dropped torch, and the publisher's CUDA context (its copy of the model included)
        # died with its image: only the arena is left on the GPU, held by the exported fd.
        assert "libtorch" not in Path(f"/proc/{proc.pid}/maps").read_text()
        wait_for(
            lambda: torch.cuda.mem_get_info(0)[0] >= free_before - ready.arena_bytes - (64 << 20),
            timeout=30,
            what=f"the publisher's GPU memory to be freed but the {ready.arena_bytes}-byte arena",
        )

        source = model()
        want = forward(source)
        target, weights, bound = bound_model(llama, socket_dir)
        assert weights.device_uuid == uuid and weights.bytes_mapped == ready.arena_bytes
        assert weights.aliases == {"head.weight": "embed.weight", "layers.1.cos_sin_cache": "layers.0.cos_sin_cache"}
        assert target.head.weight is target.embed.weight
        assert target.layers[1].cos_sin_cache is target.layers[0].cos_sin_cache
        assert target.wt.stride() == source.wt.stride()
        # Every tensor is a view of the mapping but the scale vLLM writes in place (a private copy).
        assert outside_mapping(target, *weights.arena.address_range) == ["_k_scale"]
        assert (bound.private, bound.private_bytes) == (1, 4)
        assert torch.equal(forward(target), want)

        wait_for(lambda: status(socket_dir).deposited, what="the keeper deposit")
        st = status(socket_dir)
        assert (st.backend, st.device_uuid, st.adopted, st.disk_bytes_read) == ("cuda-vmm", uuid, False, 123)
        with KeeperClient(keeper_socket(socket_dir)) as keeper:
            [held] = keeper.holdings()
        assert (held.backend, held.device_uuid, held.fingerprint_digest) == ("cuda-vmm", uuid, ready.fingerprint_digest)

        # SIGKILL: the mapping (and the keeper's fd) keep the arena; the engine answers on.
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        assert torch.equal(forward(target), want)
        del target, weights, bound
        gc.collect()  # this process's mapping goes: from here only the keeper holds the arena

        # A restarted publisher withdraws the arena from the keeper: nothing is published again.
        proc, ready = start_publisher(llama, socket_dir, tmp_path / "publisher-again.log")
        st = status(socket_dir)
        assert (st.adopted, st.disk_bytes_read, st.device_uuid) == (True, 0, uuid)
        again, weights, _ = bound_model(llama, socket_dir)
        assert outside_mapping(again, *weights.arena.address_range) == ["_k_scale"]
        assert torch.equal(forward(again), want)
    finally:
        if proc.poll() is None:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
