"""``weightcache gpu-holder``: the process of the per-node pod that books a cache's GPUs.

It requests the GPUs (its pod does, through ``nvidia.com/gpu``), writes which ones it got to the
grant file (gpu_grant.py says why and how), and then does nothing until SIGTERM: no CUDA context,
no torch, no memory on the GPUs. Its only job is to keep the GPUs in the scheduler's books for as
long as daemons of any generation keep weights on them.

Which GPUs it got: the device plugin makes the allocated GPUs the only ones the container sees,
so NVML's enumeration is the answer. Where ``NVIDIA_VISIBLE_DEVICES`` lists UUIDs (the plugin's
default device-id strategy), the holder also requires NVML to see exactly those, so that a
container that sees more than it was given (privileged, or an image default of ``all``) fails
with a clear message instead of granting GPUs that belong to other pods.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import threading
import time
from pathlib import Path

from weightcache_contract.errors import WeightCacheError

from .device_memory import nvml_gpu_uuids
from .gpu_grant import Grant, take_lock, write_grant

log = logging.getLogger("weightcache.gpu_holder")
NON_LISTS = frozenset({"", "all", "none", "void"})
"""``NVIDIA_VISIBLE_DEVICES`` values that name no particular device."""


def granted_gpus(visible_devices: str | None, nvml_uuids: list[str], expect: int | None) -> list[str]:
    """The GPUs this holder was given, in NVML index order. ``visible_devices``: the value of
    ``NVIDIA_VISIBLE_DEVICES``; ``expect``: how many GPUs the pod requested (None: any number)."""
    listed = [d.strip() for d in (visible_devices or "").split(",") if d.strip()]
    if any(d.startswith("MIG-") for d in listed):
        raise WeightCacheError(
            f"NVIDIA_VISIBLE_DEVICES lists MIG devices ({visible_devices}); the GPU holder "
            "books whole GPUs only: give the cache whole GPUs"
        )
    uuids = list(nvml_uuids)
    if listed and all(d.startswith("GPU-") for d in listed):
        unseen = [d for d in listed if d not in nvml_uuids]
        if unseen:
            raise WeightCacheError(
                f"NVIDIA_VISIBLE_DEVICES names {', '.join(unseen)}, which NVML does not see "
                f"(it sees {', '.join(nvml_uuids) or 'no GPU'}); check the NVIDIA container runtime"
            )
        extra = [u for u in nvml_uuids if u not in listed]
        if extra:
            raise WeightCacheError(
                f"this container sees {', '.join(extra)} besides the GPUs it was given "
                f"({', '.join(listed)}); do not run the GPU holder privileged"
            )
    elif listed and not all(d.lower() in NON_LISTS for d in listed):
        log.info(
            "NVIDIA_VISIBLE_DEVICES names no UUIDs; granting every GPU NVML sees",
            extra={"fields": {"NVIDIA_VISIBLE_DEVICES": visible_devices}},
        )
    if not uuids:
        raise WeightCacheError(
            "the GPU holder sees no GPU: its pod must request nvidia.com/gpu and run with the NVIDIA container runtime"
        )
    if expect is not None and len(uuids) != expect:
        raise WeightCacheError(
            f"the GPU holder sees {len(uuids)} GPUs ({', '.join(uuids)}) but its pod requested "
            f"{expect}: a container that sees GPUs it was not given cannot tell which are its own; "
            "do not run it privileged or with NVIDIA_VISIBLE_DEVICES=all"
        )
    return uuids


def run(out: Path, expect: int | None) -> int:
    """Book: take the lock, write the grant, hold until SIGTERM/SIGINT. Returns the exit code."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        found = nvml_gpu_uuids()
    except OSError as error:
        raise WeightCacheError(
            f"the GPU holder reads its GPUs through NVML, which failed ({error}); the container "
            "needs the NVIDIA runtime with the 'utility' driver capability"
        ) from None
    uuids = granted_gpus(os.environ.get("NVIDIA_VISIBLE_DEVICES"), found, expect)
    out.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    lock_fd = take_lock(out, token)
    try:
        grant = Grant(
            uuids=tuple(uuids),
            token=token,
            pod=os.environ.get("POD_NAME", socket.gethostname()),
            pod_uid=os.environ.get("POD_UID", ""),
            node=os.environ.get("NODE_NAME", ""),
            pid=os.getpid(),
            written_at=time.time(),
        )
        write_grant(out, grant)
        log.info("holding GPUs", extra={"fields": {"gpus": ",".join(uuids), "file": str(out), "pod": grant.pod}})
        while not stop.wait(3600):
            pass
        # The grant stays: the next holder replaces it (gpu_grant.py says why); the lock goes with us.
        log.info("stopping; the GPUs are no longer booked", extra={"fields": {"gpus": ",".join(uuids)}})
        return 0
    finally:
        os.close(lock_fd)
