"""vLLM's own model construction and weight loading for one rank, with the plain-weights policy.

Both the publisher (which copies the result into an arena) and the engine's disk fallback
(which serves it directly) build through ``load_rank_model``, so a rank's tensors are the same
either way. It is vLLM's ``BaseModelLoader.load_model`` split open so the policy can mark the
layers between construction and post-processing (vLLM's own weight-cache daemon does the same).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.config.load import LoadConfig
from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_default_torch_dtype
from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import VLLM_REPLAY_KERNEL_ENV

from . import versions
from .cpu_policy import keep_plain_weights


def join_rank_group(vllm_config: VllmConfig, rank: int, init_method: str, device: int = 0) -> None:
    """Join the rank's world (all ranks of one publisher group call this) and carve the TP/PP groups.

    vLLM's layers read their rank and world size from these groups while they are built and
    loaded; the publisher runs no collective of its own. On a GPU the rank's model is loaded onto
    CUDA ordinal ``device``: vLLM's groups take their device from the local rank, so it is that."""
    parallel = vllm_config.parallel_config
    local_rank = rank
    if current_platform.is_cuda():
        torch.cuda.set_device(device)
        local_rank = device
    # The CPU communicator names its shared-memory segments after this; one group per publisher.
    os.environ.setdefault("VLLM_DIST_IDENT", "weightcache-" + init_method.rsplit(":", 1)[-1])
    init_distributed_environment(
        world_size=parallel.world_size,
        rank=rank,
        distributed_init_method=init_method,
        local_rank=local_rank,
        backend=current_platform.dist_backend,
    )
    with set_current_vllm_config(vllm_config):
        ensure_model_parallel_initialized(parallel.tensor_parallel_size, parallel.pipeline_parallel_size)
    unlink_group_names()


def unlink_group_names() -> None:
    """Remove the names vLLM's process groups made on this host: each group's mappings and
    connections stay, nothing can find them any more.

    A CPU tensor- or pipeline-parallel group makes one ``/dev/shm/<group>_<rank>`` per rank
    (16 MiB each at TP=2; its C++ manager, which ``destroy_model_parallel`` leaves alone, unlinks
    them only in static destructors), and each group's message queue a ring buffer in ``/dev/shm``
    (24 MiB) and ZeroMQ sockets under ``VLLM_RPC_BASE_PATH``. The exec into the serving image runs
    no destructor, so each daemon start left them all behind (the multiprocessing resource tracker
    removed the ring buffer after the exec, but not after a kill of the whole process group). Both
    are joined by every rank before the group exists (barriers, and the queue's ready handshake), so
    once ``ensure_model_parallel_initialized`` returns the names are needed by no one; the daemon
    sends nothing through them. Removed now, a daemon stopped, crashed or killed while it loads
    leaves nothing either. Every rank removes its groups' shared-memory names (the first wins); the
    queue's writer, which made them, removes the queue's."""
    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    from vllm.distributed.device_communicators.shm_broadcast import ShmRingBuffer
    from vllm.distributed.parallel_state import _groups

    for ref in list(_groups.values()):
        group = ref()
        communicator = getattr(group, "device_communicator", None)
        shm = getattr(communicator, "dist_module", None)
        if communicator is not None and isinstance(shm, _CPUSHMDistributed):
            for rank in range(communicator.world_size):
                _unlink(f"/dev/shm/{shm.group_name}_{rank}")
        queue = getattr(group, "mq_broadcaster", None)
        if queue is None or not queue._is_writer:
            continue
        ring = queue.buffer
        if isinstance(ring, ShmRingBuffer) and ring.is_creator:
            ring.shared_memory.unlink()  # and off the resource tracker's list
            ring.is_creator = False  # its destructor would unlink the name a second time
        for address in (queue.handle.local_subscribe_addr, queue.handle.local_notify_addr):
            if address is not None and address.startswith("ipc://"):
                _unlink(address.removeprefix("ipc://"))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


CONSUMED_SCALARS = frozenset({"q_scale", "k_scale", "v_scale", "prob_scale"})
"""An attention layer's scale scalars as loaded, which vLLM's KV-cache post-processing reads and then
deletes (``BaseKVCacheMethod``): the daemon publishes them as loaded (``keep_consumed``), so that an
engine replaying post-processing on the mapped weights (versions.py) reads what a disk load gives it."""


def load_rank_model(
    vllm_config: VllmConfig,
    model_config: ModelConfig,
    load_config: LoadConfig,
    prefix: str = "",
    check: Callable[[nn.Module], None] | None = None,
    keep_consumed: bool = False,
) -> nn.Module:
    """Build, load and post-process this rank's model with vLLM's loader for ``load_config``;
    ``check`` sees the built model before a weight is loaded (and may refuse it); ``keep_consumed``
    puts the ``CONSUMED_SCALARS`` back as loaded after post-processing (for publication)."""
    loader = get_model_loader(load_config)
    device = torch.device(vllm_config.device_config.device if load_config.device is None else load_config.device)
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype):
        with device:
            model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
        if current_platform.is_cpu():
            keep_plain_weights(model)
        if check is not None:
            check(model)
        loader.load_weights(model, model_config)
        loaded = _consumed_scalars(model) if keep_consumed else []
        process_weights_after_loading(model, model_config, device)
        for module, leaf, value in loaded:
            if getattr(module, leaf, None) is None:
                module.register_parameter(leaf, nn.Parameter(value, requires_grad=False))
    built: nn.Module = model.eval()
    return built


def _consumed_scalars(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor]]:
    """Copies of the loaded ``CONSUMED_SCALARS`` (post-processing may scale them in place first)."""
    return [
        (module, leaf, param.detach().clone())
        for module in model.modules()
        for leaf, param in module._parameters.items()
        if leaf in CONSUMED_SCALARS and param is not None
    ]


def refuse_unpublishable(model: nn.Module, model_config: ModelConfig) -> None:
    """Refuse, by name, quantization methods an engine could not rebuild from published tensors.

    The engine re-runs post-processing around the mapped tensors (versions.py): in vLLM's "weights
    already processed" mode, which only methods declaring ``supports_pre_processed_weights`` can do
    (their post-processed state is tensors only), or, in a vLLM without that mode, as after a disk
    load, which only the methods in ``versions.REPLAYABLE`` leave as published. Others (online
    quantization, opaque kernel handles, packed copies) would fail there, or hold state outside the
    arena. Run on the built model before a byte is loaded (``load_rank_model``'s ``check``), so
    nothing is published."""
    refused: dict[str, str] = {}  # method (and the kernel it prepares for) → first layer using it
    kernels = False
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase) and not rebuildable(method):
            kernel = versions.replay_kernel(method)
            kernels |= kernel is not None
            refused.setdefault(type(method).__name__ + (f" for {kernel}" if kernel else ""), name or "<root>")
    if refused:
        import vllm

        methods = ", ".join(f"{m} (e.g. layer {layer})" for m, layer in refused.items())
        pin = ""
        if kernels and current_platform.is_cuda():
            env = " ".join(f"{k}={v}" for k, v in VLLM_REPLAY_KERNEL_ENV.items())
            pin = (
                f"for block FP8, start the daemon and the engines with {env} in their environment (the operator does); "
            )
        raise WeightCacheError(
            f"quantization {model_config.quantization or 'none'!r} cannot be served from the weight cache by "
            f"vLLM {vllm.__version__} on {current_platform.device_type}: vLLM's {methods} cannot rebuild its "
            f"state from post-processed weights, so an engine could not map what the daemon publishes. {pin}Use "
            "a checkpoint quantized ahead of time in a method vLLM can serve pre-processed (e.g. block-FP8 "
            "weights in the checkpoint), drop --quantization from --engine-args, or a vLLM whose method can "
            "(docs/vllm.md); engines that need this method load from disk (--load-format auto)"
        )


def rebuildable(method: QuantizeMethodBase) -> bool:
    """Whether an engine can rebuild ``method``'s state around published tensors (see above)."""
    if versions.pre_processed_mode():
        return bool(getattr(method, "supports_pre_processed_weights", False))
    return versions.replayable(method, current_platform.device_type)
