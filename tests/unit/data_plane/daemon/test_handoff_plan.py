"""What a publisher hands across ``exec``: the one fd that keeps its arena alive, per backend, and
a serving daemon that refuses an arena of another backend than its own flags say. The exec
itself runs in tests/integration/test_handoff.py (cpu-shm) and tests/gpu/test_vllm_profile_gpu.py
(cuda-vmm)."""

from __future__ import annotations

import os

import msgpack
import pytest
from torch import nn
from weightcache.arenas.arena import HeldFdArena
from weightcache.checkpoints.sharding import Layout
from weightcache.daemon.handoff import handoff_state
from weightcache.daemon.rank import DaemonConfig, run
from weightcache.engine_profiles.publish import publish
from weightcache.wire.fingerprint import EngineStamp, EnvironmentStamp, Fingerprint
from weightcache.wire.rankfiles import RankFiles
from weightcache_contract.errors import WeightCacheError

FINGERPRINT = Fingerprint(
    model_path="/m",
    revision="",
    config_sha256="c",
    shards=(),
    tp_size=1,
    tp_rank=0,
    pp_size=1,
    pp_rank=0,
    quantization="none",
    quantization_sha256="q",
    dtype="float32",
    layout_version=1,
    environment=EnvironmentStamp(torch_version="2", device_kind="NVIDIA H200", backend="cuda-vmm"),
    engine=EngineStamp(engine="test", version="1", load_profile="test", settings={}),
)


def test_a_cpu_shm_arena_is_handed_over_as_its_memfd() -> None:
    published = publish(nn.Linear(4, 4), FINGERPRINT.digest, "test/rank-0")
    state = handoff_state(
        published.arena, published.manifest, FINGERPRINT, lock_fd=7, load_seconds=1.0, disk_bytes_read=5, adopted=False
    )
    assert (state.backend, state.arena_fd, state.device_uuid) == ("cpu-shm", published.arena.fd, None)
    assert state.mapping_bytes == published.arena.mapping_bytes == published.manifest.arena_bytes
    published.arena.close()


def test_a_cuda_vmm_arena_is_handed_over_as_its_exported_fd_with_its_gpu() -> None:
    # A cuda-vmm arena withdrawn from the keeper is exactly this: its exported fd, held by a
    # process without CUDA (the fd's file is a stand-in; HeldFdArena never looks inside).
    fd = os.memfd_create("stand-in")
    arena = HeldFdArena(fd, size=1000, mapping_bytes=2 << 20, device_uuid="GPU-1234")
    published = publish(nn.Linear(4, 4), FINGERPRINT.digest, "test/rank-0")
    state = handoff_state(
        arena, published.manifest, FINGERPRINT, lock_fd=7, load_seconds=0.1, disk_bytes_read=0, adopted=True
    )
    assert (state.backend, state.arena_fd, state.mapping_bytes, state.device_uuid) == (
        "cuda-vmm",
        fd,
        2 << 20,
        "GPU-1234",
    )
    arena.close()
    published.arena.close()


def test_the_serving_daemon_refuses_an_arena_of_another_backend_than_its_flags(tmp_path) -> None:
    published = publish(nn.Linear(4, 4), FINGERPRINT.digest, "test/rank-0")
    files = RankFiles(str(tmp_path / "sock"), "handed", 0)
    files.claim()
    assert files.lock_fd is not None
    state = handoff_state(
        published.arena,
        published.manifest,
        FINGERPRINT,
        lock_fd=files.lock_fd,
        load_seconds=0,
        disk_bytes_read=0,
        adopted=False,
    ).model_copy(update={"backend": "cuda-vmm"})
    path = tmp_path / "state.msgpack"
    path.write_bytes(msgpack.packb(state.model_dump(mode="python")))
    cfg = DaemonConfig(
        model="/m", layout=Layout(), socket_dir=str(tmp_path / "sock"), name="handed", handoff_state=str(path)
    )
    with pytest.raises(
        WeightCacheError, match="handed over a cuda-vmm arena to a daemon started with --backend cpu-shm"
    ):
        run(cfg)
    # The refused daemon owns what it was handed: it lets go of the lock and the arena's fd.
    assert not files.lock_is_held()
    with pytest.raises(OSError):
        os.fstat(published.arena.fd)
