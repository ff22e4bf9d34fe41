"""Which GPU, and which software, an arena's bytes belong to — read without importing torch.

The daemon stamps these facts into every fingerprint and checks them again when it re-adopts
an arena from the keeper. That restart path must stay under a second, and ``import torch``
alone costs one to several, so the facts come from the CUDA driver API (cuda-bindings) and the
torch build from ``torch/version.py`` read as text. Engines use the same functions, so the two
sides of a fingerprint comparison can never disagree on formatting.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcache_contract.errors import WeightCacheError


@dataclass(frozen=True)
class GpuFacts:
    uuid: str
    """``GPU-`` + the 8-4-4-4-12 hex form that ``nvidia-smi -L`` and torch print."""
    name: str
    compute_capability: str
    driver_version: str


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:  # pragma: no cover - depends on the installation
        raise WeightCacheError("GPU backends need the cuda-bindings package (pip install cuda-bindings)") from None
    return driver


def _ok(result: Any, what: str) -> Any:
    cu = _driver()
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise WeightCacheError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else (tuple(rest) if rest else None)


@functools.cache
def gpu_count() -> int:
    """GPUs this process sees (after ``CUDA_VISIBLE_DEVICES``); 0 without a driver or a GPU."""
    try:
        cu = _driver()
        _ok(cu.cuInit(0), "cuInit")
        return int(_ok(cu.cuDeviceGetCount(), "cuDeviceGetCount"))
    except (WeightCacheError, RuntimeError, OSError):
        return 0  # no libcuda, no device, or a driver that refuses: no GPU for our purposes


def start_primary_context(ordinal: int = 0) -> bool:
    """Initialise the driver and create GPU ``ordinal``'s primary context; False without a GPU.

    The primary context is the one the CUDA runtime (torch) adopts on its first call, so a process
    that calls this on a thread while it imports torch pays for the context (a few hundred ms on an
    H200) beside the import, not after it: the driver calls drop the GIL. The context is retained
    for the life of the process, as torch's own is.
    """
    if ordinal >= gpu_count():
        return False
    cu = _driver()
    device = _ok(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    _ok(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    return True


@functools.cache
def gpu_facts(ordinal: int) -> GpuFacts:
    """Facts of this process's GPU ``ordinal`` (its own numbering; only UUIDs cross processes)."""
    if ordinal >= gpu_count():
        raise WeightCacheError(
            f"GPU {ordinal} is not visible to this process ({gpu_count()} visible); "
            "check CUDA_VISIBLE_DEVICES and the pod's GPU request"
        )
    cu = _driver()
    device = _ok(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    raw = bytes(_ok(cu.cuDeviceGetUuid(device), "cuDeviceGetUuid").bytes).hex()
    name = _ok(cu.cuDeviceGetName(64, device), "cuDeviceGetName")
    attr = cu.CUdevice_attribute
    major = _ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device), "attribute")
    minor = _ok(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device), "attribute")
    version = _ok(cu.cuDriverGetVersion(), "cuDriverGetVersion")
    return GpuFacts(
        uuid=f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}",
        name=name.split(b"\0", 1)[0].decode() if isinstance(name, bytes) else str(name),
        compute_capability=f"{major}.{minor}",
        driver_version=f"{version // 1000}.{version % 1000 // 10}",
    )


def ordinal_for_uuid(uuid: str) -> int | None:
    """This process's ordinal for the GPU ``uuid``, or None when it is not visible here."""
    return next((i for i in range(gpu_count()) if gpu_facts(i).uuid == uuid), None)


@functools.cache
def torch_build() -> tuple[str, str | None]:
    """(torch version without the local tag, CUDA version torch was built with), from
    ``torch/version.py`` parsed as text; importing torch only if that file is not there."""
    spec = importlib.util.find_spec("torch")
    if spec is None:
        raise WeightCacheError("torch is not installed; the daemon and the client need it to load weights")
    values: dict[str, Any] = {}
    for location in spec.submodule_search_locations or []:
        path = Path(location) / "version.py"
        if path.is_file():
            for node in ast.parse(path.read_text()).body:
                target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
                value = getattr(node, "value", None)
                if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                    values[target.id] = value.value
            break
    if "__version__" not in values:
        import torch  # an unusual installation: pay for the import rather than guess

        values = {"__version__": torch.__version__, "cuda": torch.version.cuda}
    return str(values["__version__"]).split("+")[0], values.get("cuda")
