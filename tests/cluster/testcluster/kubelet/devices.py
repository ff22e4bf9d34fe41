"""Simulated GPUs: each node's ``nvidia.com/gpu`` capacity as stable fake GPU UUIDs.

The scheduler only counts GPUs; a device plugin decides which ones a container gets and
tells it through ``NVIDIA_VISIBLE_DEVICES``. Doing the same here lets the operator and
daemon code paths that key on GPU UUIDs (ready-file names, per-node rank status) run on a
machine without GPUs. The UUIDs are derived from the node name, so they are the same in
every run.
"""

from __future__ import annotations

import threading
import uuid

from ..rest import Object

GPU_RESOURCE = "nvidia.com/gpu"


def gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{index}.{node}.gpu.weightcache.test"))


def gpus_requested(container: Object) -> int:
    resources = container.get("resources") or {}
    amount = (resources.get("limits") or {}).get(GPU_RESOURCE) or (resources.get("requests") or {}).get(GPU_RESOURCE)
    return int(amount or 0)


class GpuPool:
    """One node's GPUs; hands each container distinct ones until they are released."""

    def __init__(self, node: str, count: int) -> None:
        self._free = [gpu_uuid(node, i) for i in range(count)]
        self._lock = threading.Lock()

    def allocate(self, count: int) -> list[str]:
        with self._lock:
            if count > len(self._free):
                raise RuntimeError(f"{count} GPUs wanted, {len(self._free)} free")
            taken, self._free = self._free[:count], self._free[count:]
            return taken

    def release(self, gpus: list[str]) -> None:
        with self._lock:
            self._free.extend(g for g in gpus if g not in self._free)
