"""How a generation change goes: blue/green where every daemon has room for a second copy, node by
node otherwise."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.daemon_report import HOST_DEVICE, DaemonReport

Strategy = Literal["BlueGreen", "NodeByNode"]
HEADROOM = 1.1
"""A second copy must find its arenas' size plus 10 %: allocators round up, and the engines
starting next to it need some memory of their own."""
GPU_CONTEXT_BYTES = 1 << 30
"""On a GPU a second copy also costs the new daemon's CUDA context: about 0.7 GiB per torch process
on an H200 (docs/benchmarks.md: two engines' contexts took 1.42 GiB), more than the 10 % of a
small model's arenas."""


def generation_strategy(
    requested: str,
    backend: str,
    reports: Mapping[str, DaemonReport | str],
    headroom: float = HEADROOM,
    *,
    gpu_access: str = "visibleDevices",
    gpus_shared: str | None = None,
) -> tuple[Strategy, str]:
    """How a generation change should go, and why. Blue/green only when the user allows it
    (``spec.daemon.generationChange: Auto``), a second daemon pod can be placed where the arenas
    live, and every daemon reports, for every device its ranks hold, free memory of at least their
    arenas' size times ``headroom`` (the allocator's slack), plus ``GPU_CONTEXT_BYTES`` on a GPU.
    Otherwise node by node. ``reports``: each daemon pod's status report (or why it could not be
    read), taken when the change starts.

    Where a second daemon pod can go:
    - cpu-shm: anywhere; the arenas are host memory.
    - cuda-vmm: daemon pods request no GPUs; the GPU holder pod books them
      (render/gpu_holder.py), so two generations' daemons see the same GPUs and each finds its
      own by UUID. Each generation has its own socket directory and keeper, and a cuMem fd is
      private to the process it was passed to, so nothing of one generation reaches the other.
    - cuda-ipc: the same holder, so placement is the same. It is sound too: both generations'
      daemons and engines run in the host's PID and IPC namespaces (hostPID/hostIPC, as every
      cuda-ipc pod does), where their pids cannot collide; a legacy CUDA IPC handle names one
      allocation of one exporting process, and an engine opens only the handle its own
      generation's socket hands it. No keeper is involved (it cannot hold these handles), and the
      old daemons go only after the old engines that opened their handles have drained.
    - ``gpuAccess: dra``: node by node. Each daemon pod's GPUs come from a ResourceClaim of its
      own, made from the pod's template, which no pod of another generation shares.
    ``gpus_shared``: why the GPU holder does not book the serving daemons' GPUs for a second
    generation (``gpu_holder.blue_green_blocker``), or None when it does."""
    if requested == "NodeByNode":
        return "NodeByNode", "spec.daemon.generationChange is NodeByNode"
    gpu = backend in GPU_BACKENDS
    if gpu and gpu_access == "dra":
        return "NodeByNode", (
            "gpuAccess dra: each daemon pod's GPUs come from a ResourceClaim of its own, which a"
            " second generation's daemon pod cannot share"
        )
    if gpu and gpus_shared is not None:
        return "NodeByNode", gpus_shared
    if not reports:
        return "NodeByNode", "no daemon has reported its ranks and free memory yet"
    fits: list[str] = []
    for pod, report in sorted(reports.items()):
        if isinstance(report, str):
            return "NodeByNode", f"the free memory of {pod} is unknown ({report})"
        need: dict[str, int] = {}
        for rank in report.ranks:
            if rank.bytes is None:
                return "NodeByNode", f"{pod} does not report the arena size of rank {rank.rank} yet"
            device = rank.gpu_uuid or HOST_DEVICE
            need[device] = need.get(device, 0) + rank.bytes
        memory = {m.device: m for m in report.memory}
        for device, size in sorted(need.items()):
            free = memory.get(device)
            if free is None or free.free_bytes is None:
                why = f": {free.error}" if free is not None and free.error else ""
                return "NodeByNode", f"{pod} reports no free memory for {device}{why}"
            wanted = int(size * headroom) + (GPU_CONTEXT_BYTES if device != HOST_DEVICE else 0)
            if free.free_bytes < wanted:
                return "NodeByNode", (
                    f"{device} of {pod} has {_gib(free.free_bytes)} free; a second copy of its"
                    f" ranks needs {_gib(wanted)}"
                )
            fits.append(device)
    where = " on the GPUs the holder books" if gpu else ""
    return "BlueGreen", (
        f"every daemon has room for a second copy{where} ({len(reports)} daemons, {len(fits)} devices checked)"
    )


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.2f} GiB"
