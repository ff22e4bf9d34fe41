"""The ``weightcache`` load format: an SGLang engine maps its rank's post-processed weights from the
cache.

``python -m sglang.launch_server --model-path MODEL <engine args> --load-format weightcache
--model-loader-extra-config '{"name": "...", "socket_dir": "...", "fallback": "disk"}'``. The model
is built on the meta device as SGLang's default loader builds it, every parameter and buffer is
bound to a read-only view of the rank's mapped arena (``engine_profiles.bind``), and nothing is
post-processed again: the arena holds what SGLang's ``process_weights_after_loading`` produced in
the daemon, as SGLang's own IPC cache loader assumes for its daemon's export. A tensor the arena
lacks stays on meta and is refused by name.

When the daemon is missing or holds other weights, ``fallback: disk`` loads with SGLang's default
loader and logs why; ``fallback: error`` raises.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch
from sglang.srt.configs.load_config import LoadConfig, LoadFormat
from sglang.srt.model_loader.loader import (
    BaseModelLoader,
    DefaultModelLoader,
    _get_quantization_config,
    _initialize_model,
)
from sglang.srt.model_loader.utils import set_default_torch_dtype
from torch import nn
from weightcache_contract.backends import GPU_BACKENDS
from weightcache_contract.launch import SGLANG_PROFILE

from ..client.weights import Weights
from ..engine_profiles.bind import bind_arena, check_bound
from ..engine_profiles.mapping import Options, map_or_reason
from ..gpu.gpu_identity import gpu_facts
from . import versions
from .stamp import platform_backend, rank_fingerprint

log = logging.getLogger("sglang.weightcache")


class WeightcacheModelLoader(BaseModelLoader):
    def __init__(self, load_config: LoadConfig) -> None:
        import sglang

        versions.check(sglang.__version__)
        super().__init__(load_config)
        self.options = Options.parse(load_config.model_loader_extra_config)
        # SGLang compares the runner's load format with its enum after the loader is chosen.
        load_config.load_format = LoadFormat.AUTO
        self.disk_config = dataclasses.replace(load_config, model_loader_extra_config={})
        self.weights: Weights | None = None  # the mapped rank; holding it keeps the mapping alive

    def download_model(self, model_config: Any) -> None:
        DefaultModelLoader(self.disk_config).download_model(model_config)

    def load_model(self, *, model_config: Any, device_config: Any) -> nn.Module:
        from sglang.srt.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank
        from sglang.srt.runtime_context import get_server_args

        server_args = get_server_args()
        tp_rank, pp_rank = get_tensor_model_parallel_rank(), get_pp_group().rank_in_group
        backend = platform_backend()
        device = int(device_config.gpu_id or 0) if backend in GPU_BACKENDS else 0
        want = rank_fingerprint(server_args, model_config, tp_rank, pp_rank, backend=backend, device=device)
        rank = pp_rank * want.tp_size + tp_rank
        uuid = gpu_facts(device).uuid if backend in GPU_BACKENDS else None
        weights = map_or_reason(self.options, SGLANG_PROFILE, want, rank, backend, uuid)
        if isinstance(weights, str):
            log.warning("loading from disk: %s", weights)
            loaded: nn.Module = DefaultModelLoader(self.disk_config).load_model(
                model_config=model_config, device_config=device_config
            )
            return loaded
        started = time.perf_counter()
        with set_default_torch_dtype(model_config.dtype):
            with torch.device("meta"):
                model: nn.Module = _initialize_model(
                    model_config, self.disk_config, _get_quantization_config(model_config, self.disk_config)
                )
        built = time.perf_counter()
        assert weights.manifest is not None
        bound = bind_arena(model, weights.tensors, weights.manifest.kinds_by_name(), weights.aliases)
        check_bound(model)
        self.weights = weights
        # The mapping lives as long as the model: SGLang keeps the model, not the loader.
        model._weightcache_weights = weights  # type: ignore[assignment]
        model._weightcache_bound = bound  # type: ignore[assignment]
        log.info(
            "Mapping and binding weights took %.3f seconds (weightcache %r rank %d: %d tensors, %d bytes; "
            "map %.3f s, model on the meta device %.3f s, bind %.3f s)",
            weights.seconds + time.perf_counter() - built,
            self.options.name,
            rank,
            len(weights.tensors),
            weights.bytes_mapped,
            weights.seconds,
            built - started,
            time.perf_counter() - built,
        )
        model.eval()
        return model
