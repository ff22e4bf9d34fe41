"""``--vllm-args``: the engine's own vLLM arguments, parsed by vLLM's parser into the config it runs.

The operator renders one list into both the daemon (``--vllm-args '<JSON>'``) and the engine
(``vllm serve MODEL <the same list> --load-format weightcache ...``), so the daemon's fingerprint
is computed from exactly the ``VllmConfig`` the engine will compute its own from.
"""

from __future__ import annotations

import json

from weightcache_contract.errors import WeightCacheError

# Flags the daemon sets itself or that would make the engine load something else than the arena.
RESERVED = ("--model", "--load-format", "--model-loader-extra-config")


def parse_list(text: str | None) -> list[str]:
    """The JSON list of strings ``--vllm-args`` carries (torch- and vLLM-free)."""
    if text is None:
        raise WeightCacheError(
            "--profile vllm needs --vllm-args: the JSON list of vLLM engine arguments the engine gets after "
            "`vllm serve MODEL`, e.g. '[\"--dtype\",\"bfloat16\"]' ('[]' for vLLM's defaults)"
        )
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise WeightCacheError(f"--vllm-args is not JSON ({exc}); pass a JSON list of strings") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise WeightCacheError(f"--vllm-args must be a JSON list of strings, got {text!r}")
    for flag in RESERVED:
        if any(v == flag or v.startswith(flag + "=") for v in value):
            raise WeightCacheError(
                f"--vllm-args contains {flag}, which the daemon and the engine's weightcache loader set "
                "themselves; remove it from the list (the model is the daemon's --model)"
            )
    return value


def engine_args(model: str, vllm_args: list[str], tp_size: int, pp_size: int):  # type: ignore[no-untyped-def]
    """vLLM's ``EngineArgs`` for ``vllm serve model <vllm_args>``; refuses a parallel layout that
    disagrees with the daemon's ``--tp-size`` / ``--pp-size``."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="weightcache daemon --vllm-args"))
    try:
        namespace = parser.parse_args(["--model", model, *vllm_args])
    except SystemExit:
        raise WeightCacheError(
            f"vLLM's engine-argument parser refused --vllm-args {vllm_args} (its message is above); fix the list"
        ) from None
    args = EngineArgs.from_cli_args(namespace)
    if (args.tensor_parallel_size, args.pipeline_parallel_size) != (tp_size, pp_size):
        raise WeightCacheError(
            f"--vllm-args ask vLLM for tensor parallel {args.tensor_parallel_size} and pipeline parallel "
            f"{args.pipeline_parallel_size}, but the daemon was started with --tp-size {tp_size} --pp-size "
            f"{pp_size}; make them agree (the engine gets the same list, so its ranks must be the daemon's)"
        )
    return args


def engine_config(model: str, vllm_args: list[str], tp_size: int, pp_size: int):  # type: ignore[no-untyped-def]
    """vLLM's ``VllmConfig`` for ``vllm serve model <vllm_args>``: what the engine will run.

    vLLM's config checks (an architecture it does not know, a setting the model refuses) raise
    ``ValueError`` (pydantic's ``ValidationError`` is one); they become one line naming the
    problem and the fix instead of a traceback."""
    args = engine_args(model, vllm_args, tp_size, pp_size)
    try:
        return args.create_engine_config()
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
            fix = "fix --vllm-args or the checkpoint (the engine would refuse the same list)"
        raise WeightCacheError(f"vLLM cannot build an engine for {model}: {reason}; {fix}") from None


def _vllm_reason(exc: ValueError) -> str:
    """The first error, without the list of every supported architecture vLLM appends."""
    errors = getattr(exc, "errors", None)  # pydantic.ValidationError
    text = str(errors()[0].get("msg", exc)) if callable(errors) and errors() else str(exc)
    return text.removeprefix("Value error, ").split(" Supported architectures:")[0].strip().rstrip(".")
