"""A published model's checkpoint as headers only, from its real config.json: what the daemon's
planner reads, at the real size, in a few kilobytes of disk.

Tensor names and shapes come from the transformers class the config names, built on the meta
device with one decoder layer whose tensors are repeated for every layer (as
``weightcache.tools.sample_checkpoints.shapes`` does for generated models); experts are split per
expert as Hub checkpoints store them. A config with a block-FP8 ``quantization_config`` stores
what the daemon's sharding table quantizes as float8 weights plus float32 ``weight_scale_inv``
blocks, the layout of the published FP8 checkpoints. The one shard file is sparse: its tensor
bytes are holes, so only planning and fingerprints may use it.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from weightcache.checkpoints import dtypes
from weightcache.checkpoints.quantization import SCALE_SUFFIX, scale_shape
from weightcache.checkpoints.sharding import rules_for
from weightcache.client.binding import empty_model
from weightcache.tools.sample_checkpoints import _per_expert


def stored_tensors(config: dict[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Checkpoint name → (dtype name, shape) for every tensor a checkpoint of ``config`` stores."""
    import torch
    import transformers

    one_layer = transformers.AutoConfig.for_model(**{**config, "num_hidden_layers": 1})
    with empty_model():
        model = transformers.AutoModelForCausalLM.from_config(one_layer, dtype=torch.bfloat16)
    before: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    layer: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    after: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for name, parameter in model.named_parameters():
        found = re.fullmatch(r"model\.layers\.0\.(.+)", name)
        if found:
            layer[found.group(1)] = (tuple(parameter.shape), parameter.dtype)
        else:
            (after if layer else before)[name] = (tuple(parameter.shape), parameter.dtype)
    layers = {
        f"model.layers.{i}.{suffix}": value
        for i in range(int(config["num_hidden_layers"]))
        for suffix, value in _per_expert(layer).items()
    }
    every = {**before, **layers, **after}
    if config.get("tie_word_embeddings"):
        every.pop("lm_head.weight", None)

    quantization = config.get("quantization_config") or {}
    block = quantization.get("weight_block_size")
    rules = rules_for(config["architectures"][0])
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, (shape, dtype) in every.items():
        if block and len(shape) == 2 and rules.rule_for(name)[0].quantize:
            out[name] = ("float8_e4m3fn", shape)
            out[name + SCALE_SUFFIX] = ("float32", scale_shape(shape, (int(block[0]), int(block[1]))))
        else:
            out[name] = (dtypes.to_name(dtype), shape)
    return out


def write_header_checkpoint(config_file: Path, out: Path) -> Path:
    """``config_file`` and one sparse safetensors file holding a checkpoint's headers, in ``out``."""
    config = json.loads(config_file.read_text())
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(config_file.read_text())
    codes = {name: code for code, name in dtypes.SAFETENSORS_DTYPES.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in stored_tensors(config).items():
        nbytes = dtypes.itemsize(dtype) * math.prod(shape)
        header[name] = {"dtype": codes[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads its header to 8 bytes
    with (out / "model.safetensors").open("wb") as shard:
        shard.write(len(raw).to_bytes(8, "little") + raw)
        shard.truncate(8 + len(raw) + offset)
    return out
