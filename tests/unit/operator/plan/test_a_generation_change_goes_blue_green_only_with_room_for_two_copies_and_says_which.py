"""The generation strategy (rollout.strategy): blue/green only where every node has room for a second copy
of the weights, in host memory or on every GPU, by what the daemons report; what it could not read is said;
the change is under way with its strategy until the rollout completes."""

from __future__ import annotations

import pytest
from builders import NOW
from rollout_pods import GEN, daemon, engine
from weightcache_contract.daemon_report import DaemonReport, DeviceMemory, RankReport
from weightcache_operator.plan.rollout.planner import plan
from weightcache_operator.plan.rollout.status import change_under_way, rollout_conditions
from weightcache_operator.plan.rollout.strategy import generation_strategy
from weightcache_operator.spec import RolloutStatus


def report(ranks: list[tuple[str | None, int | None]], memory: dict[str, int | None]) -> DaemonReport:
    """A daemon's status report: (GPU UUID or None for cpu-shm, arena bytes) per rank, free bytes per device."""
    return DaemonReport(
        cache="tiny",
        ready=True,
        ranks=[RankReport(rank=i, ready=True, gpu_uuid=gpu, bytes=size) for i, (gpu, size) in enumerate(ranks)],
        memory=[
            DeviceMemory(
                device=d,
                free_bytes=f,
                total_bytes=None if f is None else f * 2,
                error=None if f is not None else "NVML: not found",
            )
            for d, f in memory.items()
        ],
    )


def test_generation_strategy_blue_green_only_with_room_for_a_second_copy_on_every_node() -> None:
    shm = {
        "d1": report([(None, 3 << 30), (None, 3 << 30)], {"host": 7 << 30}),
        "d2": report([(None, 3 << 30), (None, 3 << 30)], {"host": 64 << 30}),
    }
    mode, why = generation_strategy("Auto", "cpu-shm", shm)
    assert mode == "BlueGreen" and "2 daemons" in why
    # 6 GiB of arenas need 6.6 GiB with the headroom: 6.5 GiB free on one node is not enough.
    tight = {**shm, "d1": report([(None, 3 << 30), (None, 3 << 30)], {"host": int(6.5 * (1 << 30))})}
    mode, why = generation_strategy("Auto", "cpu-shm", tight)
    assert mode == "NodeByNode" and "host of d1" in why and "6.50 GiB free" in why and "6.60 GiB" in why
    assert generation_strategy("NodeByNode", "cpu-shm", shm) == (
        "NodeByNode",
        "spec.daemon.generationChange is NodeByNode",
    )
    mode, why = generation_strategy("Auto", "cpu-shm", {**shm, "d2": "GET http://10.0.0.2:9400/status: timed out"})
    assert mode == "NodeByNode" and "d2" in why and "timed out" in why
    mode, why = generation_strategy("Auto", "cpu-shm", {"d1": report([(None, None)], {"host": 1 << 40})})
    assert mode == "NodeByNode" and "rank 0" in why
    assert generation_strategy("Auto", "cpu-shm", {})[0] == "NodeByNode"


@pytest.mark.parametrize("backend", ["cuda-vmm", "cuda-ipc"])
def test_generation_strategy_on_gpus_is_blue_green_when_every_gpu_has_room(backend: str) -> None:
    gpus = {
        "d1": report(
            [("GPU-a", 40 << 30), ("GPU-b", 40 << 30)], {"host": 1 << 40, "GPU-a": 90 << 30, "GPU-b": 50 << 30}
        )
    }
    mode, why = generation_strategy("Auto", backend, gpus)
    assert mode == "BlueGreen" and "GPUs the holder books" in why and "2 devices checked" in why
    # 40 GiB × 1.1 + the new daemon's CUDA context (1 GiB) = 45 GiB; 44.5 GiB free is not enough.
    short = {
        "d1": report(
            [("GPU-a", 40 << 30), ("GPU-b", 40 << 30)],
            {"host": 1 << 40, "GPU-a": 90 << 30, "GPU-b": int(44.5 * (1 << 30))},
        )
    }
    mode, why = generation_strategy("Auto", backend, short)
    assert mode == "NodeByNode" and "GPU-b of d1" in why and "44.50 GiB free" in why and "needs 45.00 GiB" in why
    mode, why = generation_strategy("Auto", backend, gpus, gpu_access="dra")
    assert mode == "NodeByNode" and "ResourceClaim of its own" in why
    blocked = "daemon pod tiny-daemon-x requests nvidia.com/gpu itself"
    assert generation_strategy("Auto", backend, gpus, gpus_shared=blocked) == ("NodeByNode", blocked)
    assert generation_strategy("NodeByNode", backend, gpus)[0] == "NodeByNode"
    # The blocker is about GPUs: host memory arenas ignore it.
    shm = {"d1": report([(None, 1 << 30)], {"host": 64 << 30})}
    assert generation_strategy("Auto", "cpu-shm", shm, gpus_shared=blocked)[0] == "BlueGreen"


def test_generation_strategy_on_gpus_says_what_it_could_not_read() -> None:
    unreadable = {"d1": report([("GPU-a", 40 << 30)], {"host": 1 << 40, "GPU-a": None})}
    mode, why = generation_strategy("Auto", "cuda-vmm", unreadable)
    assert mode == "NodeByNode" and "no free memory for GPU-a" in why and "NVML" in why


def test_a_generation_change_is_under_way_with_its_strategy_until_the_rollout_completes() -> None:
    result = plan(GEN, [engine("a0", 0, "active", "old", "g1")], [daemon("d1", "node-1", "g1")], "g1", NOW, None, 1)
    change = change_under_way(result, GEN, ("NodeByNode", "no room"))
    assert change is not None and (change.strategy, change.why, change.total) == ("NodeByNode", "no room", 1)
    # Only Progressing stays a rollout's condition; GenerationChange is the aggregate's (the phase needs it).
    assert [c.type for c in rollout_conditions(result, NOW, [], 7)] == ["Progressing"]
    finished = plan(GEN, [], [], "g2", NOW, RolloutStatus(phase="Complete"), 0)
    assert change_under_way(finished, GEN, None) is None
