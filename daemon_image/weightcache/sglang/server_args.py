"""``--engine-args`` for the ``sglang`` profile: the engine's own SGLang arguments, parsed by SGLang's
parser (``prepare_server_args``, the one ``python -m sglang.launch_server`` uses) into the
``ServerArgs`` the engine will run with, and resolved as SGLang resolves them.

The operator renders one list into both the daemon (``--engine-args '<JSON>'``) and the engine
(``python -m sglang.launch_server --model-path MODEL <the same list> --load-format weightcache ...``),
so the daemon's fingerprint comes from the configuration the engine computes its own from. What the
cache cannot serve is refused from the parsed and resolved values, never from the strings: SGLang's
parser decides what ``--load_format``, a prefix or a ``--config`` file mean.
"""

from __future__ import annotations

import logging
from typing import Any

from weightcache_contract.errors import WeightCacheError
from weightcache_contract.launch import ENGINE_ARGS

CHECKPOINT_LOAD_FORMATS = ("auto", "safetensors")
"""SGLang load formats that read the checkpoint's safetensors the way the engine's disk fallback
does (``auto`` finds them). Others read other bytes (``dummy``: random values; ``pt``/``npcache``:
files the fingerprint's shard stamps do not cover; ``sharded_state``, ``layered``, ``gguf``, ``remote*``,
``private``, ``ipc_cache``: other sources or other layouts)."""
QUANTIZATIONS = (None, "fp8")
"""What the ``sglang`` profile serves, as SGLang resolves ``--quantization`` and the checkpoint's
``quantization_config``: unquantized, and FP8 with a weight block (the block-FP8 checkpoints of the
MoE models this cache exists for)."""


def parse(model: str, engine_args: list[str]) -> Any:
    """SGLang's resolved ``ServerArgs`` for ``sglang serve --model-path model <engine_args>``."""
    from sglang.srt.server_args import prepare_server_args

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        server_args = prepare_server_args(["--model-path", model, *engine_args])
        if hasattr(server_args, "resolve_once"):  # see resolved()
            server_args.resolve_once()
    except SystemExit:
        raise WeightCacheError(
            f"SGLang's server-argument parser refused {ENGINE_ARGS.flag} {engine_args} (its message is above); "
            "fix the list"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a --config file or a resolution rule raises rather than exits
        raise WeightCacheError(
            f"SGLang could not read {ENGINE_ARGS.flag} {engine_args}: {type(exc).__name__}: {exc}; fix the list"
        ) from None
    finally:
        root.handlers[:] = handlers  # prepare_server_args reconfigures logging for a server process
        root.setLevel(level)
    return server_args


def resolved(server_args: Any) -> Any:
    """The resolved values of SGLang's ``ServerArgs``. SGLang 0.5.21 defers resolution to
    ``resolve_once`` and reads the result through ``resolving_view``; 0.5.17's ``ServerArgs`` (a
    dataclass without ``resolve_once``) resolves every field in ``__post_init__``, so the fields are
    the resolved values."""
    if not hasattr(server_args, "resolve_once"):
        return server_args
    from sglang.srt.arg_groups.overrides import resolving_view

    return resolving_view(server_args)


def refuse_unservable(server_args: Any, model: str, tp_size: int, pp_size: int) -> None:
    """What the daemon cannot publish for an engine with these arguments, each named with its fix."""
    cfg = resolved(server_args)
    given = f"(from {ENGINE_ARGS.flag}, however it is spelled: a flag, its underscore form or a --config file)"
    if cfg.model_path != model:
        raise WeightCacheError(
            f"{ENGINE_ARGS.flag} set SGLang's model to {cfg.model_path!r} {given}; remove it: the model is the "
            f"daemon's --model {model}, which the engine gets as --model-path"
        )
    if str(cfg.load_format) not in CHECKPOINT_LOAD_FORMATS:
        raise WeightCacheError(
            f"SGLang would load with load_format={cfg.load_format!r} {given}, which does not read the checkpoint's "
            f"safetensors the way the engine's disk fallback does; remove it (the daemon reads with SGLang's "
            "'auto', the engine gets --load-format weightcache)"
        )
    if cfg.model_loader_extra_config not in (None, "", "{}", {}):
        raise WeightCacheError(
            f"SGLang's loader would get model_loader_extra_config={cfg.model_loader_extra_config!r} {given}; remove "
            "it: the daemon loads with SGLang's default loader options and the engine's weightcache loader gets "
            "its own"
        )
    if cfg.speculative_algorithm or cfg.speculative_draft_model_path:
        raise WeightCacheError(
            f"speculative decoding ({cfg.speculative_algorithm or 'a draft model'}) {given} loads a second model "
            "that the cache does not serve yet; remove the speculative arguments, or serve with --load-format auto"
        )
    if cfg.enable_lora or cfg.lora_paths:
        raise WeightCacheError(
            f"LoRA adapters {given} are loaded beside the weights and the cache does not serve them yet; remove "
            "--enable-lora/--lora-paths, or serve with --load-format auto"
        )
    if cfg.dp_size != 1 or cfg.enable_dp_attention:
        raise WeightCacheError(
            f"data parallel {cfg.dp_size} (attention: {cfg.enable_dp_attention}) {given} is not served from the "
            "cache yet: one daemon world serves one engine's tensor and pipeline ranks; remove --dp-size and "
            "--enable-dp-attention"
        )
    if cfg.weight_cache_mode not in (None, "off"):
        raise WeightCacheError(
            f"--weight-cache-mode {cfg.weight_cache_mode} {given} is SGLang's own weight cache daemon; remove it "
            "(the engine gets --load-format weightcache)"
        )
    if (cfg.tp_size, cfg.pp_size) != (tp_size, pp_size):
        raise WeightCacheError(
            f"{ENGINE_ARGS.flag} ask SGLang for tensor parallel {cfg.tp_size} and pipeline parallel {cfg.pp_size}, "
            f"but the daemon was started with --tp-size {tp_size} --pp-size {pp_size}; make them agree (the engine "
            "gets the same list, so its ranks must be the daemon's)"
        )


def refuse_quantization(model_config: Any) -> None:
    """Quantization outside ``QUANTIZATIONS``, as SGLang resolved it from the flags and the checkpoint."""
    quantization = model_config.quantization
    quant_config = getattr(model_config.hf_config, "quantization_config", None)
    if quantization not in QUANTIZATIONS:
        raise WeightCacheError(
            f"SGLang would serve quantization={quantization!r} (from --quantization in {ENGINE_ARGS.flag}, a --config "
            "file, or the checkpoint's quantization_config), which the weight cache does not serve (allowed: none, "
            "block FP8); remove it or serve an unquantized or block-FP8 checkpoint"
        )
    if quantization == "fp8" and not _weight_block(quant_config):
        raise WeightCacheError(
            "SGLang would quantize to FP8 per tensor while loading (--quantization fp8 on a checkpoint without a "
            "block-FP8 quantization_config), which the weight cache does not serve: serve a block-FP8 checkpoint "
            "(quantization_config with weight_block_size) or an unquantized one without --quantization"
        )


def _weight_block(quant_config: Any) -> Any:
    if quant_config is None:
        return None
    if isinstance(quant_config, dict):
        return quant_config.get("weight_block_size")
    return getattr(quant_config, "weight_block_size", None)
