"""``spec.engine.vllm``: engines that are vLLM, and the node-local cache of their compile
artifacts."""

from __future__ import annotations

from pydantic import Field

from weightcache_operator.spec.base import ApiModel

ARTIFACT_CACHE_DEFAULT_BYTES = 8 << 30


class ArtifactCache(ApiModel):
    """A node-local cache of the engines' compile artifacts (vLLM's torch.compile, Inductor and
    Triton output), next to the weights: the first engine of a configuration on a node compiles
    and its daemon publishes the result, later engines with the same key start from it
    (docs/vllm.md, *Compile artifacts*)."""

    max_bytes: int = Field(
        default=ARTIFACT_CACHE_DEFAULT_BYTES,
        ge=1 << 20,
        description="The bound on the node's published entries for this cache, in bytes; the least recently used"
        " entries are evicted beyond it (never one an engine is copying out).",
    )


class Vllm(ApiModel):
    """The engines are vLLM: ``vllm serve`` maps an arena in vLLM's own layout, which the daemons
    build with vLLM's loader (their ``vllm`` profile). The operator derives one list of vLLM
    arguments from the spec (``--dtype``, ``--tensor-parallel-size``, ``--pipeline-parallel-size``,
    ``--enable-expert-parallel``, ``--quantization``, ``--revision``, ``--max-model-len``, then
    ``args``) and gives the very same list to the daemons and the engines, so that both compute
    the same fingerprint. The engine template still supplies image, resources and env; its first
    container's command is rendered here."""

    args: list[str] = Field(
        default=[],
        description="vLLM arguments that shape the weights or the model (for example --kv-cache-dtype, "
        "--hf-overrides, --enforce-eager), given to daemons and engines alike after the ones derived from the "
        "spec. Changing them is a daemon generation change.",
    )
    engine_args: list[str] = Field(
        default=[],
        description="vLLM arguments for the engines only: serving options that leave the weights alone (for "
        "example --max-num-seqs, --gpu-memory-utilization). Changing them rolls the "
        "engines, not the daemons.",
    )
    max_model_len: int | None = Field(
        default=None, ge=1, description="vLLM's --max-model-len; unset: the model's own context length."
    )
    kv_cache_space_gib: int | None = Field(
        default=None,
        ge=1,
        alias="kvCacheSpaceGiB",
        description="Required on CPU (daemon.backend cpu-shm), refused elsewhere: each engine's KV cache in GiB"
        " (VLLM_CPU_KVCACHE_SPACE). vLLM's automatic CPU sizing subtracts the worker's resident memory, which"
        " counts every mapped weight page as the engine's own, so two engines would each pay for the one"
        " shared copy. On GPUs size the KV cache with --gpu-memory-utilization in engineArgs"
        " (docs/operator.md).",
    )
    artifact_cache: ArtifactCache | None = Field(
        default=None,
        description="Set: engines keep their compile artifacts in a per-node directory the daemon pod owns, keyed"
        " by the weights, vLLM's version and image, the device and vLLM's compilation-relevant configuration;"
        " an engine whose key was published starts from it instead of compiling. Unset (the default): each"
        " engine compiles into its own filesystem. Setting or changing it is a daemon generation change (the"
        " daemons publish and evict).",
    )
