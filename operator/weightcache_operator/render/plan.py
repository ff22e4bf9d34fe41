"""The daemon pod's ``plan`` init container: the daemon's own planner, run before any rank starts.

The operator cannot read the checkpoint; the daemon pod mounts it. So the pod's first step after
``own-host-dirs`` is ``weightcache plan --verdict`` over the same typed spec the daemon gets
(model, dtype, quantization, tensor × pipeline × expert): torch-free, safetensors headers only.
A layout the tables refuse (a pipeline deeper than the model, heads a tensor size does not
divide, …) or ranks that cannot fit the node's memory end it with exit code 2 and the refusal as
its termination message, which ``reasons.exit_reason`` reads from
``status.initContainerStatuses`` like any exit, so the cache turns ``Failed`` with the planner's
words while no rank process has started. A plan that fits leaves its summary there instead
(``weightcache_contract.plan_summary``), which ``status.plan`` reports.

Memory is checked where the planner knows it (``--fit``): on GPU backends each rank against the
largest GPU NVML lists in the pod (``NVIDIA_VISIBLE_DEVICES=all`` as the daemon's, or the DRA
claim), on ``cpu-shm`` the node's ranks together against the host's ``MemTotal`` and the daemon
container's memory limit (memfd pages are charged to the daemon's memory cgroup).

Only profiles whose arenas the daemon's own planner computes get the container
(``EngineProfile.plans``); the others' daemons refuse by themselves.
"""

from __future__ import annotations

import re
from typing import Any

from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import PlanArgs
from weightcache_contract.plan_summary import PLAN_CONTAINER

from weightcache_operator.render.dra import container_claims, uses_dra
from weightcache_operator.render.gpu_holder import uses_gpu_holder
from weightcache_operator.render.layout import explain_exits
from weightcache_operator.render.security import container_security
from weightcache_operator.spec import WeightCache
from weightcache_operator.vocabulary import CLI, MODEL_MOUNT

__all__ = ["PLAN_CONTAINER", "memory_bytes", "plan_init"]

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$")
_FACTORS = {
    None: 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def memory_bytes(quantity: Any) -> int | None:
    """A memory quantity (``64Gi``, ``68719476736``, ``1.5G``) in bytes; None for forms this does not
    read (the planner then checks against the host alone, never against a wrong number)."""
    found = _QUANTITY.match(str(quantity).strip()) if quantity is not None else None
    if found is None:
        return None
    return int(float(found.group(1)) * _FACTORS[found.group(2)])


def plan_init(cache: WeightCache, ranks: list[int], model_mount: dict[str, Any]) -> dict[str, Any]:
    """The init container that plans ``ranks`` (this pod's) within the whole world and exits 2
    with the refusal when the daemon would refuse or the ranks cannot fit."""
    spec = cache.spec
    gpu = spec.daemon.backend in GPU_BACKENDS
    limit = memory_bytes(((spec.daemon.resources or {}).get("limits") or {}).get("memory"))
    model = spec.model
    block = model.quantization.weight_block_size
    # What the daemon loads with, less the revision (a label of the fingerprint, not of the plan).
    planned = PlanArgs(
        model=MODEL_MOUNT,
        dtype=model.dtype,
        quantization=model.quantization.method,
        weight_block_size=(block[0], block[1]) if model.quantization.method == "fp8" else None,
        tp_size=spec.parallelism.tensor,
        pp_size=spec.parallelism.pipeline,
        ep_size=spec.parallelism.expert,
        verdict=True,
        ranks=tuple(ranks),
        fit="gpu" if gpu else "host",
        memory_limit=limit if not gpu else None,
    )
    command = [*CLI, "plan", *planned.to_argv()]
    container: dict[str, Any] = {
        "name": PLAN_CONTAINER,
        "image": spec.daemon.image,
        "command": command,
        "volumeMounts": [dict(model_mount)],
        "securityContext": container_security(read_only_root=True),
    }
    if uses_gpu_holder(cache):
        # NVML reads the devices' memory without a CUDA context; the holder books them, not us.
        container["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    elif gpu and uses_dra(cache):
        container["resources"] = {"claims": container_claims()}
    return explain_exits(container)
