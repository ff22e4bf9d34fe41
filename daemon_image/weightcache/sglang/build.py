"""SGLang's loading of one rank inside the daemon, as its model runner does it: the runtime context
published for the rank, SGLang's process groups joined, its ``ModelConfig``, and its default loader's
load and post-processing (``DefaultModelLoader.load_model``: ``load_weights`` then every quant
method's ``process_weights_after_loading``).

SGLang 0.5.17 and 0.5.21 differ in how a process is given its rank and its parallel sizes; each
branch below names the fact it keys on (docs/sglang.md: "SGLang versions")."""

from __future__ import annotations

from typing import Any

from torch import nn

from .server_args import resolved


def model_config_of(server_args: Any, tp_rank: int) -> Any:
    """SGLang's ``ModelConfig`` as its model runner holds it when it loads: on the CPU adjusted for a
    tensor-parallel size the heads do not divide (padded heads, ``original_*`` fields)."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp
    from sglang.srt.platforms import current_platform

    cfg = resolved(server_args)
    model_config = ModelConfig.from_server_args(server_args)
    if current_platform.is_cpu():
        load_config = LoadConfig(load_format=cfg.load_format, tp_rank=tp_rank)
        model_config = adjust_config_with_unaligned_cpu_tp(model_config, load_config, cfg.tp_size)
    return model_config


def publish_rank(server_args: Any, tp_rank: int, pp_rank: int, device: int) -> None:
    """SGLang's process-wide configuration for this rank (what its layers read while built)."""
    from sglang.srt import runtime_context
    from sglang.srt.layers.moe import initialize_moe_config

    if not hasattr(runtime_context, "SpawnRanks"):
        # SGLang 0.5.17: a process publishes its configuration only; its ranks are read from the
        # process groups join_rank_group makes, and the MoE settings come from the arguments.
        runtime_context.publish(server_args, role="weight_cache_daemon")
        initialize_moe_config(server_args)
        return
    world_rank = runtime_context.spawn_world_rank(server_args, tp_rank=tp_rank, pp_rank=pp_rank)
    ranks = runtime_context.SpawnRanks(world_rank=world_rank, gpu_id=device)
    runtime_context.publish(server_args, role="weight_cache_daemon", ranks=ranks)
    initialize_moe_config()


def join_rank_group(
    server_args: Any, model_config: Any, tp_rank: int, pp_rank: int, rendezvous: str, device: int
) -> None:
    """SGLang's world of ``tp_size * pp_size`` ranks at ``rendezvous`` (gloo on the CPU)."""
    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers import dp_attention
    from sglang.srt.platforms import current_platform

    cfg = resolved(server_args)
    init_distributed_environment(
        world_size=cfg.tp_size * cfg.pp_size,
        rank=cfg.tp_size * pp_rank + tp_rank,
        distributed_init_method=rendezvous,
        local_rank=device,
        backend=current_platform.get_torch_distributed_backend_str(),
        moe_a2a_backend=cfg.moe_a2a_backend,
    )
    if not hasattr(dp_attention, "init_dp_gathered_buffer"):
        # SGLang 0.5.17 passes the parallel sizes in (its scheduler's ParallelState: attention data
        # parallel is 1 without DP attention, which the daemon refuses) and sizes the DP buffer from
        # the model config inside initialize_dp_attention; 0.5.21 reads both from the published context.
        initialize_model_parallel(
            tensor_model_parallel_size=cfg.tp_size,
            pipeline_model_parallel_size=cfg.pp_size,
            expert_model_parallel_size=cfg.ep_size,
            attention_context_model_parallel_size=cfg.attn_cp_size,
            moe_data_model_parallel_size=cfg.moe_dp_size,
            decode_context_parallel_size=cfg.dcp_size,
        )
        unlink_group_names()
        dp_attention.initialize_dp_attention(server_args, model_config)
        return
    initialize_model_parallel()
    unlink_group_names()
    dp_attention.initialize_dp_attention(server_args)
    dp_attention.init_dp_gathered_buffer(model_config)


def unlink_group_names() -> None:
    """Remove the names SGLang's process groups made in ``/dev/shm``: their mappings stay, nothing
    can find them any more.

    A group of more than one rank makes a message-queue ring buffer (``sgl_shm_mq_<pid>_*``, 24 MiB),
    created by its writer and registered with multiprocessing's resource tracker; only the buffer's
    destructor unlinks it. The exec into the serving image runs no destructor: the resource tracker
    removed it after the exec (warning of a leaked shared_memory object), and nothing did after a
    kill of the whole process group. Every rank opened it before the group exists (the queue's ready
    handshake), and the daemon sends nothing through it, so the writer removes it now; a daemon
    stopped, crashed or killed while it loads leaves nothing either."""
    from sglang.srt.distributed.device_communicators.shm_broadcast import ShmRingBuffer
    from sglang.srt.distributed.parallel_state import _groups

    for ref in list(_groups.values()):
        queue = getattr(ref(), "mq_broadcaster", None)
        if queue is None or not queue._is_writer:
            continue
        ring = queue.buffer
        if isinstance(ring, ShmRingBuffer) and ring.is_creator:
            ring.shared_memory.unlink()  # and off the resource tracker's list
            ring.is_creator = False  # its destructor would unlink the name a second time


def load_rank_model(server_args: Any, model_config: Any, tp_rank: int, device: int) -> nn.Module:
    """The rank's model through SGLang's default loader: loaded and post-processed."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader.loader import get_model_loader
    from sglang.srt.platforms import current_platform

    cfg = resolved(server_args)
    load_config = LoadConfig(load_format=cfg.load_format, tp_rank=tp_rank)
    loader = get_model_loader(load_config=load_config, model_config=model_config)
    model: nn.Module = loader.load_model(
        model_config=model_config, device_config=DeviceConfig(current_platform.device_type, device)
    )
    if not current_platform.is_cpu():
        current_platform.synchronize()  # every post-processing kernel done before the copy into the arena
    return model
