"""The ``weightcache`` load format: vLLM maps its rank's post-processed weights from the cache.

``vllm serve MODEL --load-format weightcache --model-loader-extra-config
'{"name": "...", "socket_dir": "...", "fallback": "disk"}'``. The model is built on the meta
device, every parameter and buffer is bound to a read-only view of the rank's mapped arena
(bind.py), and ``process_weights_after_loading`` runs again around the mapped weights as the
vLLM version allows (versions.py): in vLLM's "weights already processed" mode, which only rebuilds
Python-side state, or replayed and checked. Quantization methods that cannot be rebuilt are refused
by the daemon before it loads them (``build.refuse_unpublishable``), and by vLLM itself or the
replay check here, naming the layer and method.

When the daemon is missing or holds other weights, ``fallback: disk`` loads with vLLM's own
loader under the same CPU policy and logs why; ``fallback: error`` raises.
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from torch import nn
from vllm.config import ModelConfig, VllmConfig
from vllm.config.load import LoadConfig
from vllm.distributed import get_dp_group, get_pp_group, get_tensor_model_parallel_rank
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_default_torch_dtype
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.errors import (
    BindError,
    WeightCacheError,
)
from weightcache_contract.launch import VLLM_PROFILE

from ..client.weights import Weights, held_bytes
from ..engine_profiles.bind import bind_arena, check_bound, outside_mapping
from ..engine_profiles.mapping import Options, map_or_reason
from ..gpu.gpu_identity import gpu_facts
from ..wire.fingerprint import Fingerprint
from . import startup, versions
from .artifacts import claim_artifacts
from .build import load_rank_model
from .cpu_policy import keep_plain_weights
from .stamp import platform_backend, rank_fingerprint

# A child of vLLM's "vllm" logger: vLLM's logging configuration prints these lines (the phase
# timings beside its own "Loading weights took"), where a logger of our own would stay silent.
log = logging.getLogger("vllm.weightcache")

# Buffers vLLM's post-processing writes in place even for pre-processed weights: every
# ``Attention.process_weights_after_loading`` fills its scale scalars with 1.0 when the
# checkpoint has none (``set_default_quant_scales``). A write into a read-only map faults, so
# each engine gets its own copy of these (4 bytes each); everything else stays a view.
WRITTEN_IN_PLACE = frozenset({"_k_scale", "_v_scale", "_q_scale", "_prob_scale"})


@dataclasses.dataclass(frozen=True)
class _Expected:
    rank: int
    fingerprint: Fingerprint
    backend: str
    gpu_uuid: str | None


class WeightcacheModelLoader(BaseModelLoader):
    def __init__(self, load_config: LoadConfig) -> None:
        super().__init__(load_config)
        self.options = Options.parse(load_config.model_loader_extra_config)
        self.weights: Weights | None = None  # the mapped rank; holding it keeps the mapping alive

    def _disk_config(self) -> LoadConfig:
        return dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})

    def download_model(self, model_config: ModelConfig) -> None:
        DefaultModelLoader(self._disk_config()).download_model(model_config)

    def load_weights(self, model: nn.Module, model_config: ModelConfig) -> None:
        raise WeightCacheError(
            "weights mapped from weightcache are read-only and cannot be reloaded in place; "
            "restart the engine, or serve with --load-format auto to reload weights"
        )

    def get_external_weight_memory(self, vllm_config: VllmConfig) -> int:
        """Bytes of this rank's weights held by the daemon (GPU workers take them out of the
        ``gpu_memory_utilization`` budget: they are mapped, not allocated); 0 when the load will
        go to disk. vLLM's CPU worker never asks (docs/vllm.md, memory accounting)."""
        expected = self._expected(vllm_config)
        return held_bytes(
            expected.fingerprint,
            expected.rank,
            self.options.socket_dir,
            self.options.name,
            timeout_s=self.options.timeout_s,
        )

    def _expected(self, vllm_config: VllmConfig) -> _Expected:
        """This worker's rank in the daemon's numbering, the fingerprint it expects there, and on a
        GPU the device it computes on (vLLM made it current before loading)."""
        tp_rank = get_tensor_model_parallel_rank()
        pp = get_pp_group()
        backend = platform_backend()
        device = torch.cuda.current_device() if backend in GPU_BACKENDS else 0
        want = rank_fingerprint(
            vllm_config, tp_rank, pp.rank_in_group, get_dp_group().rank_in_group, backend=backend, device=device
        )
        return _Expected(
            rank=pp.rank_in_group * vllm_config.parallel_config.tensor_parallel_size + tp_rank,
            fingerprint=want,
            backend=backend,
            gpu_uuid=gpu_facts(device).uuid if backend in GPU_BACKENDS else None,
        )

    def load_model(self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str = "") -> nn.Module:
        if model_config is not vllm_config.model_config:
            log.warning("weightcache caches the target model only; loading %s from disk", model_config.model)
            return load_rank_model(vllm_config, model_config, self._disk_config(), prefix)
        expected = self._expected(vllm_config)
        # The worker joined its process groups before it asked for the model (startup.py).
        startup.set_rank(expected.rank)
        startup.mark("distributed_init")
        model = self._load_rank(vllm_config, model_config, prefix, expected)
        startup.mark("weights_bound")
        return model

    def _load_rank(
        self, vllm_config: VllmConfig, model_config: ModelConfig, prefix: str, expected: _Expected
    ) -> nn.Module:
        """The rank's model on the mapped weights, or from disk on a fallback."""
        rank = expected.rank
        weights = map_or_reason(
            self.options, VLLM_PROFILE, expected.fingerprint, rank, expected.backend, expected.gpu_uuid
        )
        if isinstance(weights, str):
            log.warning("loading from disk: %s", weights)
            return load_rank_model(vllm_config, model_config, self._disk_config(), prefix)
        model, phases = bind_model(vllm_config, model_config, weights, prefix)
        self.weights = weights
        # Before vLLM compiles, which it does after load_model: a published entry must be in place.
        device = torch.cuda.current_device() if expected.backend in GPU_BACKENDS else 0
        claim_artifacts(vllm_config, expected.fingerprint, expected.backend, device)
        log.info(
            "Mapping and binding weights took %.3f seconds (weightcache %r rank %d: %d tensors, %d bytes; "
            "map %.3f s, bind %.3f s; model on the meta device %.3f s, post-processing %.3f s)",
            weights.seconds + phases["bind"],
            self.options.name,
            rank,
            len(weights.tensors),
            weights.bytes_mapped,
            weights.seconds,
            phases["bind"],
            phases["build"],
            phases["post_process"],
        )
        return model


def _check_replayed(model: nn.Module, weights: Weights) -> None:
    """After post-processing ran as after a disk load (versions.py, ``replay``): every tensor must
    still be a view of the arena, or one of the private copies vLLM writes in place. A tensor made
    anew was derived from weights that were already post-processed, so it would be processed twice."""
    assert weights.arena is not None
    start, end = weights.arena.address_range
    made = [name for name in outside_mapping(model, start, end) if name.rpartition(".")[2] not in WRITTEN_IN_PLACE]
    if made:
        import vllm

        raise BindError(
            f"vLLM {vllm.__version__}'s post-processing made {len(made)} tensor(s) anew from the mapped weights, "
            f"e.g. {made[0]!r}, so they would be processed twice; this quantization method cannot be served from "
            f"the cache by this vLLM: load from disk (--load-format auto) or use vLLM {versions.supported()} "
            "with a method that can (docs/vllm.md)"
        )


def bind_model(
    vllm_config: VllmConfig, model_config: ModelConfig, weights: Weights, prefix: str = ""
) -> tuple[nn.Module, dict[str, float]]:
    """The rank's model on the meta device, bound to ``weights``, post-processed in pre-processed
    mode; with the seconds each phase took (build, bind, post_process)."""
    assert weights.manifest is not None
    kinds = weights.manifest.kinds_by_name()
    device = torch.device(vllm_config.device_config.device)
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    with set_default_torch_dtype(model_config.dtype):
        with torch.device("meta"):
            model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
        if current_platform.is_cpu():
            keep_plain_weights(model)
        build = lap()
        bound = bind_arena(model, weights.tensors, kinds, weights.aliases, WRITTEN_IN_PLACE)
        bind = lap()
        if versions.pre_processed_mode():
            from vllm.model_executor.utils import weights_already_processed

            with weights_already_processed():
                process_weights_after_loading(model, model_config, device)
        else:
            process_weights_after_loading(model, model_config, device)
            _check_replayed(model, weights)
        check_bound(model)
        post_process = lap()
    # The mapping lives as long as the model: vLLM keeps the model, not the loader.
    model._weightcache_weights = weights
    model._weightcache_bound = bound
    return model.eval(), {"build": build, "bind": bind, "post_process": post_process}
