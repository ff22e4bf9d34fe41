"""``spec.engine.sglang``: engines that are SGLang."""

from __future__ import annotations

from pydantic import Field

from weightcache_operator.spec.base import ApiModel


class Sglang(ApiModel):
    """The engines are SGLang: ``python -m sglang.launch_server --load-format weightcache`` maps an
    arena in SGLang's own layout, which the daemons build with SGLang's loader (their ``sglang``
    profile). The operator derives one list of SGLang arguments from the spec (``--dtype``,
    ``--tp-size``, ``--pp-size``, ``--quantization``, ``--revision``, ``--context-length``, on CPU
    ``--device cpu`` and ``--max-total-tokens``, then ``args``) and gives the very same list to the
    daemons and the engines, so that both compute the same fingerprint. The engine template still
    supplies image, resources and env; its first container's command is rendered here."""

    args: list[str] = Field(
        default=[],
        description="SGLang arguments that shape the weights or the model (for example --kv-cache-dtype, "
        "--json-model-override-args), given to daemons and engines alike after the ones derived from the spec. "
        "Changing them is a daemon generation change.",
    )
    engine_args: list[str] = Field(
        default=[],
        description="SGLang arguments for the engines only: serving options that leave the weights alone (for "
        "example --max-running-requests, --mem-fraction-static on GPUs). Changing them rolls the engines, not "
        "the daemons.",
    )
    context_length: int | None = Field(
        default=None, ge=1, description="SGLang's --context-length; unset: the model's own context length."
    )
    max_total_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Required on CPU (daemon.backend cpu-shm), refused elsewhere: each engine's KV cache in tokens"
        " (--max-total-tokens). SGLang's automatic CPU sizing gives most of the node's free memory to one"
        " engine's KV cache; on GPUs size it with --mem-fraction-static in engineArgs.",
    )
