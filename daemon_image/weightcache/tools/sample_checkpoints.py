"""Small real checkpoints for tests, the demo and benchmarks; nothing is ever downloaded.

Configs are the real transformers config classes for each family; weights are seeded random
tensors with the shapes the real model class declares (read off a meta-device instance), saved
as several safetensors shards with an index, exactly as the Hub lays them out. A small real
byte-level BPE tokenizer is trained with the ``tokenizers`` library so completions are text.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..checkpoints import dtypes
from ..checkpoints.quantization import DEFAULT_BLOCK, quantize_block_fp8, scale_shape
from ..checkpoints.sharding import ArchitectureRules, rules_for
from ..client.binding import empty_model

FAMILIES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
EOS = "<|endoftext|>"

_CORPUS = (
    "The weight cache keeps a model's weights resident in memory so that an engine that starts, "
    "restarts or takes over maps them in milliseconds instead of reading them from disk for minutes. "
    "Tensor parallelism splits each layer across ranks; pipeline parallelism splits the layers. "
    "A hot standby already maps the same weights and takes the traffic when the primary dies. "
    "Once upon a time a small model learned to count: one, two, three, four, five, six, seven. "
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n"
)


@dataclass(frozen=True)
class ModelSpec:
    family: str = "llama"
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 4
    num_heads: int = 8
    num_kv_heads: int = 4
    vocab_size: int = 1024
    max_position_embeddings: int = 512
    tie_word_embeddings: bool = False
    dtype: str = "bfloat16"
    shards: int = 3
    seed: int = 0
    fp8: bool = False  # store block-wise FP8 weights + scales, as a pre-quantized checkpoint would
    tokenizer: bool = True
    # qwen3_moe only: every layer's MLP is num_experts experts of moe_intermediate_size, top-k routed.
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128


def transformers_config(spec: ModelSpec) -> Any:
    import transformers

    arch = FAMILIES[spec.family]
    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    kwargs: dict[str, Any] = dict(
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        vocab_size=spec.vocab_size,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        rms_norm_eps=1e-6,
        bos_token_id=0,
        eos_token_id=0,
    )
    if spec.family in ("qwen3", "qwen3_moe"):
        kwargs["head_dim"] = spec.hidden_size // spec.num_heads
    if spec.family == "qwen3_moe":
        kwargs.update(
            num_experts=spec.num_experts,
            num_experts_per_tok=spec.num_experts_per_tok,
            moe_intermediate_size=spec.moe_intermediate_size,
            norm_topk_prob=True,
        )
    config = cls(**kwargs)
    config.architectures = [arch]
    config.dtype = spec.dtype
    return config


def shapes(spec: ModelSpec) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Names, shapes and dtypes of every tensor the checkpoint stores, from the real model class.

    The class is instantiated (on the meta device) with at most two layers and the per-layer
    shapes repeated: building a 2,000-layer transformers model just to read shapes takes minutes.
    """
    import dataclasses
    import re

    import transformers

    small = dataclasses.replace(spec, num_layers=min(spec.num_layers, 2))
    config = transformers_config(small)
    with empty_model():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtypes.to_torch(spec.dtype))
    Shapes = dict[str, tuple[tuple[int, ...], torch.dtype]]
    before: Shapes = {}
    per_layer: Shapes = {}
    after: Shapes = {}
    for name, p in model.named_parameters():
        m = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if m is None:
            (after if per_layer else before)[name] = (tuple(p.shape), p.dtype)
        elif m.group(1) == "0":
            per_layer[m.group(2)] = (tuple(p.shape), p.dtype)
    per_layer = _per_expert(per_layer)
    out = dict(before)
    for layer in range(spec.num_layers):  # layer-major, like a real checkpoint's shards
        out.update({f"model.layers.{layer}.{suffix}": v for suffix, v in per_layer.items()})
    out.update(after)
    if spec.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


def _per_expert(
    per_layer: dict[str, tuple[tuple[int, ...], torch.dtype]],
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """transformers' fused expert parameters as a Hub checkpoint stores them: one tensor per
    expert and projection (transformers stacks them back when it loads; so does the daemon)."""
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for suffix, (shape, dtype) in per_layer.items():
        if suffix == "mlp.experts.gate_up_proj":
            experts, rows, cols = shape
            for e in range(experts):
                out[f"mlp.experts.{e}.gate_proj.weight"] = ((rows // 2, cols), dtype)
                out[f"mlp.experts.{e}.up_proj.weight"] = ((rows // 2, cols), dtype)
        elif suffix == "mlp.experts.down_proj":
            experts, rows, cols = shape
            for e in range(experts):
                out[f"mlp.experts.{e}.down_proj.weight"] = ((rows, cols), dtype)
        else:
            out[suffix] = (shape, dtype)
    return out


def write_checkpoint(out_dir: str | Path, spec: ModelSpec = ModelSpec(), device: str = "cpu") -> Path:
    """Write the checkpoint; ``device="cuda"`` generates (and FP8-quantizes) on a GPU, for big benchmarks."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(out, spec)
    tensors = _random_tensors(spec, device)
    _write_shards(out, tensors, spec.shards)
    if spec.tokenizer:
        write_tokenizer(out, spec.vocab_size)
    (out / "weightcache-sample.json").write_text(json.dumps(asdict(spec), indent=2))
    return out


def _write_config(out: Path, spec: ModelSpec) -> None:
    config_dict = transformers_config(spec).to_dict()
    if spec.fp8:
        config_dict["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": list(DEFAULT_BLOCK),
            # The matrices kept in the model's dtype, by module, as published FP8 checkpoints list
            # them (e.g. Qwen3's MoE router): vLLM otherwise builds them FP8 and finds no scales.
            "modules_to_not_convert": _kept_unquantized(spec),
        }
    (out / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True))


def _random_tensors(spec: ModelSpec, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    rules = rules_for(FAMILIES[spec.family])
    tensors: dict[str, torch.Tensor] = {}
    for name, (shape, dtype) in shapes(spec).items():
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
        else:
            # std 1/sqrt(fan_in) keeps activations O(1) through the layers, like a trained model.
            fan_in = shape[-1] if len(shape) > 1 else 1
            t = torch.randn(shape, generator=gen, device=device) / math.sqrt(fan_in)
            if "embed_tokens" in name:
                t = torch.randn(shape, generator=gen, device=device)
        if _stored_as_fp8(spec, rules, name, shape):
            q, scale = quantize_block_fp8(t, DEFAULT_BLOCK)
            tensors[name] = q.cpu()
            tensors[name + "_scale_inv"] = scale.cpu()
        else:
            tensors[name] = t.to(dtype).contiguous().cpu()
    return tensors


def _kept_unquantized(spec: ModelSpec) -> list[str]:
    rules = rules_for(FAMILIES[spec.family])
    return sorted(
        name.removesuffix(".weight")
        for name, (shape, _) in shapes(spec).items()
        if name.endswith(".weight") and len(shape) == 2 and not _stored_as_fp8(spec, rules, name, shape)
    )


def _stored_as_fp8(spec: ModelSpec, rules: ArchitectureRules, name: str, shape: tuple[int, ...]) -> bool:
    """Whether a pre-quantized checkpoint stores ``name`` as FP8 weights plus block scales."""
    return spec.fp8 and rules.rule_for(name)[0].quantize and len(shape) == 2


def write_sparse_checkpoint(out_dir: str | Path, spec: ModelSpec, shard_bytes: int = 5 * 2**30) -> Path:
    """A checkpoint of any size whose tensor bytes are holes: real config.json, index and safetensors
    headers, then each shard file extended to its full length without writing (a sparse file).

    For what needs only headers — planning, fingerprints — at the size of a real model: a 140 GB
    Llama-70B-shaped checkpoint costs a few hundred KB of disk. Its weights read as zeros.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_config(out, spec)
    codes = {name: code for code, name in dtypes.SAFETENSORS_DTYPES.items()}
    rules = rules_for(FAMILIES[spec.family])
    stored: list[tuple[str, str, tuple[int, ...]]] = []
    for name, (shape, dtype) in shapes(spec).items():
        if _stored_as_fp8(spec, rules, name, shape):
            stored.append((name, "float8_e4m3fn", shape))
            stored.append((name + "_scale_inv", "float32", scale_shape(shape, DEFAULT_BLOCK)))
        else:
            stored.append((name, dtypes.to_name(dtype), shape))
    groups: list[list[tuple[str, str, tuple[int, ...]]]] = [[]]
    size = 0
    for item in stored:
        nbytes = dtypes.itemsize(item[1]) * math.prod(item[2])
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += nbytes
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        file_name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, dtype_name, shape in group:
            nbytes = dtypes.itemsize(dtype_name) * math.prod(shape)
            header[name] = {"dtype": codes[dtype_name], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = file_name
        raw = json.dumps(header).encode()
        raw += b" " * (-len(raw) % 8)  # safetensors pads its header to 8 bytes
        with (out / file_name).open("wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.truncate(8 + len(raw) + offset)
        total += offset
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
    )
    return out


def _write_shards(out: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    names = list(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per_shard = math.ceil(total / max(shards, 1))
    groups: list[list[str]] = [[]]
    size = 0
    for name in names:
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if groups[-1] and size + nbytes > per_shard and len(groups) < shards:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map = {}
    for i, group in enumerate(groups):
        file_name = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: tensors[n] for n in group}, str(out / file_name), metadata={"format": "pt"})
        weight_map.update({n: file_name for n in group})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tokenizer(out: Path, vocab_size: int) -> None:
    """A byte-level BPE tokenizer trained on a built-in corpus; fits inside the model's vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 512),
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "bos_token": EOS,
                "pad_token": EOS,
                "model_max_length": 512,
            },
            indent=2,
        )
    )
