"""GPU arenas: cuMem allocations shared by file descriptor, and legacy CUDA IPC.

``cuda-vmm`` is the default on GPUs. The daemon makes one ``cuMemCreate`` allocation per rank
with POSIX-fd handles, maps it read-write for itself, and exports an fd that travels over the
Unix socket (SCM_RIGHTS). An engine imports the fd, reserves an address range, maps it and sets
access to ``PROT_READ`` — a write faults in the writer only — unless read-write was opted into
(which is part of the fingerprint). Nothing but the socket is shared: no PID or IPC namespace.
The fd is what keeps the memory alive, so a CUDA-free keeper holding it keeps the weights
resident across a daemon's death.

``cuda-ipc`` exposes one ``cudaIpcGetMemHandle`` for the whole arena in the shape torch's
``rebuild_cuda_tensor`` expects. Legacy IPC needs the engine and daemon to share PID and IPC
namespaces (``hostPID``/``hostIPC`` between pods), cannot be held by the keeper and cannot be
mapped read-only: prefer ``cuda-vmm``.

Tensors are exposed to torch without a copy through ``__cuda_array_interface__``. GPUs are
identified by UUID, never by ordinal, because ``CUDA_VISIBLE_DEVICES`` numbers them differently
in every container.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from weightcache_contract.errors import CacheUnavailable, WeightCacheError

from ..gpu import gpu_identity
from ..wire.protocol import CudaIpcHandle
from .arena import Access, Arena, Export, MappedArena


def _cu() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:  # pragma: no cover - depends on the installation
        raise WeightCacheError(
            "the cuda-vmm backend needs the cuda-bindings package (pip install cuda-bindings)"
        ) from None
    return driver


def _ok(result: Any, what: str) -> Any:
    cu = _cu()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise WeightCacheError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


def device_uuid(ordinal: int) -> str:
    return gpu_identity.gpu_facts(ordinal).uuid


def ordinal_for_uuid(uuid: str) -> int:
    """This process's ordinal for a GPU, whatever CUDA_VISIBLE_DEVICES says."""
    ordinal = gpu_identity.ordinal_for_uuid(uuid)
    if ordinal is None:
        raise CacheUnavailable(
            f"GPU {uuid} is not visible to this process (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}); give the engine the same GPU as the daemon for this rank"
        )
    return ordinal


def _context(ordinal: int) -> None:
    """Make the device's primary context current on this thread (torch creates it)."""
    torch.cuda.set_device(ordinal)
    torch.empty(1, device=f"cuda:{ordinal}")
    _ok(_cu().cuInit(0), "cuInit")


class _DeviceBytes:
    """A flat byte range on a GPU in the form ``torch.as_tensor`` adopts without copying.

    The interface's read-only flag stays False because torch refuses it; read-only is enforced
    where it matters, by the mapping's ``PROT_READ`` access.
    """

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def _tensor_at(ptr: int, size: int, ordinal: int) -> torch.Tensor:
    return torch.as_tensor(_DeviceBytes(ptr, size), device=f"cuda:{ordinal}")


def _prop(ordinal: int) -> Any:
    cu = _cu()
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


class _VmmMapping:
    """An address range mapped onto one cuMem allocation handle, with chosen access."""

    def __init__(self, handle: Any, size: int, ordinal: int, access: Access) -> None:
        cu = _cu()
        self.handle, self.size, self.ordinal = handle, size, ordinal
        gran = _ok(
            cu.cuMemGetAllocationGranularity(
                _prop(ordinal), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            ),
            "granularity",
        )
        self.va = _ok(cu.cuMemAddressReserve(size, gran, 0, 0), "cuMemAddressReserve")
        try:
            _ok(cu.cuMemMap(self.va, size, 0, handle, 0), "cuMemMap")
            desc = cu.CUmemAccessDesc()
            desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
            desc.location.id = ordinal
            desc.flags = (
                cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
                if access == "read-only"
                else cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            )
            _ok(cu.cuMemSetAccess(self.va, size, [desc], 1), "cuMemSetAccess")
        except WeightCacheError:
            cu.cuMemAddressFree(self.va, size)
            raise
        self.ptr = int(self.va)

    def close(self) -> None:
        cu = _cu()
        cu.cuMemUnmap(self.va, self.size)
        cu.cuMemAddressFree(self.va, self.size)
        cu.cuMemRelease(self.handle)


class CudaVmmArena(Arena):
    backend = "cuda-vmm"

    def __init__(self, size: int, ordinal: int) -> None:
        cu = _cu()
        _context(ordinal)
        self.size = size
        self.ordinal = ordinal
        self.device_uuid = device_uuid(ordinal)
        gran = _ok(
            cu.cuMemGetAllocationGranularity(
                _prop(ordinal), cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
            ),
            "granularity",
        )
        self.mapping_bytes = -(-size // gran) * gran
        try:
            handle = _ok(cu.cuMemCreate(self.mapping_bytes, _prop(ordinal), 0), "cuMemCreate")
        except WeightCacheError as exc:
            free, total = torch.cuda.mem_get_info(ordinal)
            raise WeightCacheError(
                f"cannot allocate {self.mapping_bytes} bytes on {self.device_uuid} ({free} of {total} free): {exc}"
            ) from None
        self._mapping = _VmmMapping(handle, self.mapping_bytes, ordinal, "read-write")
        self._buffer = _tensor_at(self._mapping.ptr, size, ordinal)
        # One exported fd for the arena's life, dup'ed per engine and deposited with the keeper; a
        # daemon that re-adopts gets this fd back and serves it as it is (arena.HeldFdArena).
        self._fd = int(
            _ok(
                cu.cuMemExportToShareableHandle(
                    handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
                ),
                "cuMemExportToShareableHandle",
            )
        )

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def export(self) -> Export:
        return Export(fd=os.dup(self._fd))

    def handoff_fd(self) -> int:
        # The exported POSIX fd references the physical allocation by itself: it outlives this
        # process's context (the keeper holds arenas the same way).
        return self._fd

    def close(self) -> None:
        torch.cuda.synchronize(self.ordinal)
        self._buffer = None  # type: ignore[assignment]
        self._mapping.close()
        os.close(self._fd)


class CudaIpcArena(Arena):
    backend = "cuda-ipc"

    def __init__(self, size: int, ordinal: int) -> None:
        _context(ordinal)
        self.size = self.mapping_bytes = size
        self.ordinal = ordinal
        self.device_uuid = device_uuid(ordinal)
        self._tensor = torch.empty(size, dtype=torch.uint8, device=f"cuda:{ordinal}")

    def buffer(self) -> torch.Tensor:
        return self._tensor

    def export(self) -> Export:
        from torch.multiprocessing.reductions import reduce_tensor

        torch.cuda.synchronize(self.ordinal)
        _, args = reduce_tensor(self._tensor)  # type: ignore[no-untyped-call]
        return Export(
            ipc=CudaIpcHandle(
                storage_handle=args[7],
                storage_size_bytes=args[8],
                storage_offset_bytes=args[9],
                ref_counter_handle=args[11],
                ref_counter_offset=args[12],
                event_handle=args[13],
                event_sync_required=bool(args[14]),
            )
        )

    def close(self) -> None:
        self._tensor = None  # type: ignore[assignment]


def create(backend: str, size: int, ordinal: int) -> Arena:
    if not torch.cuda.is_available():
        raise WeightCacheError(f"backend {backend!r} needs a CUDA GPU and none is visible; use --backend cpu-shm")
    if backend == "cuda-vmm":
        return CudaVmmArena(size, ordinal)
    return CudaIpcArena(size, ordinal)


class VmmMapping(MappedArena):
    backend = "cuda-vmm"

    def __init__(self, fd: int, size: int, mapping_bytes: int, uuid: str, access: Access) -> None:
        cu = _cu()
        ordinal = ordinal_for_uuid(uuid)
        _context(ordinal)
        handle = _ok(
            cu.cuMemImportFromShareableHandle(
                fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
            ),
            "cuMemImportFromShareableHandle",
        )
        self._mapping = _VmmMapping(handle, mapping_bytes, ordinal, access)
        self.size = size
        self.device_uuid = uuid
        self.buffer = _tensor_at(self._mapping.ptr, size, ordinal)

    def __del__(self) -> None:
        mapping = getattr(self, "_mapping", None)
        if mapping is not None:
            try:
                mapping.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown may have torn CUDA down already
                pass


class IpcMapping(MappedArena):
    backend = "cuda-ipc"

    def __init__(self, ipc: CudaIpcHandle, size: int, uuid: str) -> None:
        from torch.multiprocessing.reductions import rebuild_cuda_tensor

        ordinal = ordinal_for_uuid(uuid)
        _context(ordinal)
        self.size = size
        self.device_uuid = uuid
        self.buffer = rebuild_cuda_tensor(  # type: ignore[no-untyped-call]
            torch.Tensor,
            torch.Size([ipc.storage_size_bytes]),
            (1,),
            0,
            torch.storage.TypedStorage,
            torch.uint8,
            ordinal,
            ipc.storage_handle,
            ipc.storage_size_bytes,
            ipc.storage_offset_bytes,
            False,
            ipc.ref_counter_handle,
            ipc.ref_counter_offset,
            ipc.event_handle,
            ipc.event_sync_required,
        )[:size]


def map_for_engine(
    backend: str,
    size: int,
    mapping_bytes: int,
    fd: int | None,
    ipc: CudaIpcHandle | None,
    uuid: str | None,
    access: Access,
) -> MappedArena:
    if uuid is None:
        raise WeightCacheError(f"{backend} fetch reply names no GPU")
    if not torch.cuda.is_available():
        raise CacheUnavailable(f"the cache is on GPU {uuid} but this process sees no CUDA device")
    if backend == "cuda-vmm":
        if fd is None:
            raise WeightCacheError("cuda-vmm fetch reply carried no fd")
        return VmmMapping(fd, size, mapping_bytes, uuid, access)
    if ipc is None:
        raise WeightCacheError("cuda-ipc fetch reply carried no IPC handle")
    return IpcMapping(ipc, size, uuid)
