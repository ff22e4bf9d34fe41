"""``--engine-args``: the engine's own vLLM arguments, parsed by vLLM's parser into the config it runs.

The operator renders one list into both the daemon (``--engine-args '<JSON>'``) and the engine
(``vllm serve MODEL <the same list> --load-format weightcache ...``), so the daemon's fingerprint
is computed from exactly the ``VllmConfig`` the engine will compute its own from.

What the daemon refuses in the list is decided on the values vLLM parsed, never on how they were
spelled: vLLM's parser takes ``--load_format`` for ``--load-format``, any unique prefix
(``--load dummy``), ``--flag=value``, dotted JSON keys (``--model-loader-extra-config.key v``) and a
``--config`` YAML file, so a string match on flags misses what vLLM will do.
"""

from __future__ import annotations

import os
from typing import Any

from weightcache_contract.errors import WeightCacheError

CHECKPOINT_LOAD_FORMAT = "auto"
"""The load format a ``vllm``-profile arena is published from, and the one the engine's
``weightcache`` loader falls back to (``loader.WeightcacheModelLoader._disk_config``): what the
arena holds must be what that engine would load from disk."""
SAME_FILES_AS_AUTO = ("auto", "hf", "safetensors")
"""Load formats for which vLLM's ``DefaultModelLoader._prepare_weights`` reads the same files as
``auto`` from a local checkpoint that has ``*.safetensors`` shards (the only kind the daemon opens)
and no Mistral ``consolidated*.safetensors`` (for which ``auto`` reads those instead): ``auto``
resolves to ``hf``, which takes ``*.safetensors`` first; ``safetensors`` takes only those. Every
other format reads other bytes (``dummy``: random values; ``pt``/``npcache``: ``*.bin``/``*.pt``
files the fingerprint's shard stamps do not cover; ``mistral``: the consolidated files;
``sharded_state``/``runai_streamer_sharded``/``tensorizer``: files written by an earlier vLLM;
``ipc_cache``/``weightcache``: another process's memory) or reads them with readers this project
has not compared (``fastsafetensors``, ``instanttensor``, ``runai_streamer``, ``modelexpress``)."""
QUANTIZATIONS = (None, "fp8")
"""vLLM quantization methods the ``vllm`` profile serves (as vLLM names them after resolving
``--quantization`` and the checkpoint's ``quantization_config``): unquantized and FP8, the
project's allowlist (docs/vllm.md). Which FP8 methods can be rebuilt from published tensors is
decided on the built model (``build.refuse_unpublishable``)."""


def disk_load_format(load_format: str, model: str) -> str:
    """The load format whose bytes a process with ``load_format`` holds for checkpoint ``model``.

    The engine's ``weightcache`` maps what its disk fallback (``auto``) would load; a format that
    reads the same files as ``auto`` here is ``auto``; any other is itself. Part of the
    fingerprint, so a daemon and an engine that would hold different bytes never agree."""
    from weightcache_contract.launch import LOAD_FORMAT

    return CHECKPOINT_LOAD_FORMAT if load_format == LOAD_FORMAT or reads_as_auto(load_format, model) else load_format


def reads_as_auto(load_format: str, model: str) -> bool:
    """Whether vLLM's loader for ``load_format`` reads the same checkpoint files as ``auto``."""
    return load_format in SAME_FILES_AS_AUTO and not _has_consolidated_shards(model)


def _has_consolidated_shards(model: str) -> bool:
    """Mistral's consolidated format, which vLLM's ``auto`` prefers over the HF shards."""
    try:
        return any(e.name.startswith("consolidated") and e.name.endswith(".safetensors") for e in os.scandir(model))
    except OSError:
        return False


def engine_args(model: str, vllm_args: list[str], tp_size: int, pp_size: int):  # type: ignore[no-untyped-def]
    """vLLM's ``EngineArgs`` for ``vllm serve model <vllm_args>``; refuses what would make the daemon
    publish other weights than the engine's (``refuse_other_weights``) and a parallel layout that
    disagrees with the daemon's ``--tp-size`` / ``--pp-size``."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="weightcache daemon --engine-args"))
    # No default model, so a model the list sets (a flag, a prefix of it, a --config file) is seen.
    parser.set_defaults(model=None)
    try:
        namespace = parser.parse_args(vllm_args)
    except SystemExit:
        raise WeightCacheError(
            f"vLLM's engine-argument parser refused --engine-args {vllm_args} (its message is above); fix the list"
        ) from None
    except Exception as exc:  # noqa: BLE001 - a --config file it cannot read raises rather than exits
        raise WeightCacheError(
            f"vLLM's engine-argument parser could not read --engine-args {vllm_args}: {type(exc).__name__}: {exc}; "
            "fix the list (a --config file must be one readable YAML mapping, given once)"
        ) from None
    if namespace.model is not None:
        raise WeightCacheError(
            f"--engine-args set vLLM's model to {namespace.model!r} (--model, a prefix of it, or model: in a "
            f"--config file); remove it: the model is the daemon's --model {model}, which the engine gets as "
            "`vllm serve MODEL`"
        )
    namespace.model = model
    args = EngineArgs.from_cli_args(namespace)
    refuse_other_weights(args.create_load_config(), args.quantization, args.quantization_config, model)
    if (args.tensor_parallel_size, args.pipeline_parallel_size) != (tp_size, pp_size):
        raise WeightCacheError(
            f"--engine-args ask vLLM for tensor parallel {args.tensor_parallel_size} and pipeline parallel "
            f"{args.pipeline_parallel_size}, but the daemon was started with --tp-size {tp_size} --pp-size "
            f"{pp_size}; make them agree (the engine gets the same list, so its ranks must be the daemon's)"
        )
    return args


def refuse_other_weights(load_config: Any, quantization: str | None, quantization_config: Any, model: str) -> None:
    """Refuse, from vLLM's parsed values, a list that would make the daemon load other weights than
    the checkpoint's (the engine gets ``--load-format weightcache`` and its loader's options after
    the list, so it would map them as the real ones): a load format that does not read the
    checkpoint, loader options, a quantization outside ``QUANTIZATIONS`` or an online one."""
    from vllm.config import ModelConfig

    spelled = "however it is spelled: a flag, its underscore form or a prefix of it, or a --config file"
    if not reads_as_auto(load_config.load_format, model):
        raise WeightCacheError(
            f"--engine-args make vLLM load with load_format={load_config.load_format!r} ({spelled}), which does not "
            "read the checkpoint's weights the way the engine's disk fallback does; remove it from --engine-args "
            f"(the daemon reads the checkpoint with vLLM's {CHECKPOINT_LOAD_FORMAT!r}, the engine gets "
            "--load-format weightcache)"
        )
    if load_config.model_loader_extra_config:
        raise WeightCacheError(
            f"--engine-args give vLLM's loader model_loader_extra_config={load_config.model_loader_extra_config!r} "
            f"({spelled}); remove it from --engine-args: the daemon loads with vLLM's default loader options and "
            "the engine's weightcache loader gets its own"
        )
    # vLLM's own normalisation (lower case), so ``-q FP8`` is ``fp8``.
    refuse_quantization(ModelConfig.validate_quantization_before(quantization), quantization_config)


def refuse_quantization(quantization: str | None, online: Any) -> None:
    """``quantization``: vLLM's method name; ``online``: its ``quantization_config`` (what
    ``--quantization-config`` asks it to quantize while loading)."""
    if quantization not in QUANTIZATIONS:
        allowed = ", ".join(str(q or "none") for q in QUANTIZATIONS)
        raise WeightCacheError(
            f"vLLM would quantize with quantization={quantization!r} (from --quantization/-q in --engine-args, a "
            f"--config file, or the checkpoint's quantization_config), which the weight cache does not serve "
            f"(allowed: {allowed}); remove it from --engine-args or serve an unquantized or FP8 checkpoint"
        )
    if online:
        raise WeightCacheError(
            f"--engine-args ask vLLM to quantize while loading with quantization_config={online!r} (--quantization-config "
            "or its prefix, or a --config file), which the weight cache does not serve: an engine cannot rebuild "
            "online-quantized state from published tensors; remove it from --engine-args and serve an unquantized or "
            "FP8 checkpoint"
        )


def engine_config(model: str, vllm_args: list[str], tp_size: int, pp_size: int):  # type: ignore[no-untyped-def]
    """vLLM's ``VllmConfig`` for ``vllm serve model <vllm_args>``: what the engine will run.

    vLLM's config checks (an architecture it does not know, a setting the model refuses) raise
    ``ValueError`` (pydantic's ``ValidationError`` is one); they become one line naming the
    problem and the fix instead of a traceback."""
    args = engine_args(model, vllm_args, tp_size, pp_size)
    try:
        config = args.create_engine_config()
    except ValueError as exc:
        reason = _vllm_reason(exc)
        if "architectures" in reason:
            import vllm

            fix = (
                f"serve a checkpoint whose config.json names an architecture this vLLM ({vllm.__version__}) supports "
                "(vllm.ModelRegistry.get_supported_archs()), or a vLLM version that supports this one in both "
                "the daemon's and the engine's image"
            )
        else:
            fix = "fix --engine-args or the checkpoint (the engine would refuse the same list)"
        raise WeightCacheError(f"vLLM cannot build an engine for {model}: {reason}; {fix}") from None
    # Resolved from the checkpoint's quantization_config and --hf-overrides too, not only the flags.
    refuse_quantization(config.model_config.quantization, config.model_config.quantization_config)
    return config


def _vllm_reason(exc: ValueError) -> str:
    """The first error, without the list of every supported architecture vLLM appends."""
    errors = getattr(exc, "errors", None)  # pydantic.ValidationError
    text = str(errors()[0].get("msg", exc)) if callable(errors) and errors() else str(exc)
    return text.removeprefix("Value error, ").split(" Supported architectures:")[0].strip().rstrip(".")
