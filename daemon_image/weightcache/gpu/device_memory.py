"""Free memory where a node's arenas live, for the operator's blue/green decision; and which GPUs
NVML sees (the GPU holder's grant, gpu_holder.py), read the same context-free way.

A daemon generation change can keep the old weights serving while the new ones load only if the
node has room for both. The daemon pod is the one place that can see that room, so its status
endpoint reports it next to the arena sizes:

- ``host``: ``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``. cpu-shm arenas are memfds,
  i.e. shared memory charged to the host's RAM, so what the kernel says it can hand out without
  swapping is the room a second arena has.
- ``GPU-<uuid>``: NVML's total (less what the driver reserves) and free bytes of that device,
  i.e. what CUDA itself reports as allocatable. NVML is read through ``ctypes``
  because the status endpoint must stay cheap and context-free: ``cuMemGetInfo`` would need a
  CUDA context (hundreds of MB of the very memory being measured, and seconds of start-up on the
  re-adoption path that never creates one), and torch is not imported here at all.

A device that cannot be read is reported with its error instead of numbers; the operator then
decides node by node and says why.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from pathlib import Path
from typing import Any

from weightcache_contract.daemon_report import HOST_DEVICE, DeviceMemory

MEMINFO = Path("/proc/meminfo")
NVML_LIBRARY = "libnvidia-ml.so.1"


def host_memory(meminfo: Path = MEMINFO) -> DeviceMemory:
    """The host's RAM: total and what can be allocated without swapping (``MemAvailable``)."""
    try:
        fields = {}
        for line in meminfo.read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
        return DeviceMemory(device=HOST_DEVICE, total_bytes=fields["MemTotal"], free_bytes=fields["MemAvailable"])
    except (OSError, KeyError, IndexError) as error:
        return DeviceMemory(device=HOST_DEVICE, error=f"{meminfo} unreadable: {error}")


class _NvmlMemoryV2(ctypes.Structure):
    """``nvmlMemory_v2_t``: unlike v1 it separates the memory the driver reserves for itself
    (~600 MiB on an H200), so total and free match what CUDA can allocate."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


_NVML_MEMORY_V2 = ctypes.sizeof(_NvmlMemoryV2) | (2 << 24)
"""``NVML_STRUCT_VERSION(Memory, 2)``: the struct's size with the version in the top byte."""


_nvml_lock = threading.Lock()


@functools.cache
def _nvml() -> Any:
    """The initialised NVML library (initialised once per process: ``nvmlInit`` is refcounted and
    the daemon never shuts it down)."""
    lib = ctypes.CDLL(NVML_LIBRARY)
    lib.nvmlErrorString.restype = ctypes.c_char_p
    code = lib.nvmlInit_v2()
    if code != 0:
        raise OSError(f"nvmlInit_v2 failed: {lib.nvmlErrorString(code).decode()}")
    return lib


def gpu_memory(uuid: str) -> DeviceMemory:
    """Total and free bytes of the GPU ``uuid`` (``GPU-…``), as NVML counts them: every process's
    allocations and contexts on the device, not only this one's."""
    try:
        with _nvml_lock:
            lib = _nvml()
            handle = ctypes.c_void_p()
            code = lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle))
            if code != 0:
                raise OSError(f"nvmlDeviceGetHandleByUUID({uuid}) failed: {lib.nvmlErrorString(code).decode()}")
            memory = _NvmlMemoryV2(version=_NVML_MEMORY_V2)
            code = lib.nvmlDeviceGetMemoryInfo_v2(handle, ctypes.byref(memory))
            if code != 0:
                raise OSError(f"nvmlDeviceGetMemoryInfo_v2({uuid}) failed: {lib.nvmlErrorString(code).decode()}")
        return DeviceMemory(device=uuid, total_bytes=int(memory.total - memory.reserved), free_bytes=int(memory.free))
    except (OSError, AttributeError) as error:
        # No libnvidia-ml in the container (NVIDIA_DRIVER_CAPABILITIES without "utility"), a
        # driver without the symbol, or a device NVML does not know.
        return DeviceMemory(device=uuid, error=f"NVML: {error}")


def nvml_gpu_uuids() -> list[str]:
    """The UUIDs of every GPU NVML enumerates here, in NVML index order. Inside a container these
    are the devices the runtime mounted: for a pod requesting ``nvidia.com/gpu``, the allocated
    ones. Raises ``OSError`` when NVML cannot be loaded or asked."""
    with _nvml_lock:
        lib = _nvml()
        count = ctypes.c_uint()
        code = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if code != 0:
            raise OSError(f"nvmlDeviceGetCount_v2 failed: {lib.nvmlErrorString(code).decode()}")
        uuids = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            code = lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
            if code != 0:
                raise OSError(f"nvmlDeviceGetHandleByIndex_v2({index}) failed: {lib.nvmlErrorString(code).decode()}")
            buf = ctypes.create_string_buffer(96)  # NVML_DEVICE_UUID_V2_BUFFER_SIZE
            code = lib.nvmlDeviceGetUUID(handle, buf, ctypes.c_uint(len(buf)))
            if code != 0:
                raise OSError(f"nvmlDeviceGetUUID({index}) failed: {lib.nvmlErrorString(code).decode()}")
            uuids.append(buf.value.decode())
    return uuids


def memory_report(gpu_uuids: list[str]) -> list[DeviceMemory]:
    """The host's memory, then each GPU's (in the order given, duplicates dropped)."""
    return [host_memory(), *(gpu_memory(uuid) for uuid in dict.fromkeys(gpu_uuids))]
