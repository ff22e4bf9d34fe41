"""Model hyper-parameters read from a checkpoint's config.json, checked against what we implement.

The engine implements the Llama decoder and its Qwen2 (q/k/v biases), Qwen3 (per-head q/k
RMSNorm) and Qwen3-MoE (Qwen3 with every MLP a top-k routed mixture of experts) variants with
default rotary embeddings. Anything else a config asks for — another
activation, rotary scaling, sliding windows — is refused by name rather than computed wrongly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weightcache_contract.errors import CheckpointError, ShardingError, UnsupportedArchitecture

from ..checkpoints.experts import num_experts
from ..checkpoints.sharding import Layout, kv_split

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM")
QK_NORM_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm over each head's q and k before the rotary embedding
    eos_token_ids: tuple[int, ...]
    # Mixture of experts (num_experts > 0): every layer's MLP routes each token to its top-k experts.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> ModelConfig:
        arch = (config.get("architectures") or ["<missing>"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitecture(
                f"the engine runs {', '.join(SUPPORTED_ARCHITECTURES)}; this checkpoint is {arch!r}"
            )
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedArchitecture(f"hidden_act {act!r} is not implemented; the engine runs SwiGLU (silu)")
        rope = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", None):
            raise UnsupportedArchitecture(f"rotary scaling {rope_type!r} is not implemented; only default rotary is")
        if config.get("use_sliding_window"):
            raise UnsupportedArchitecture("sliding-window attention is not implemented")
        if config.get("mlp_bias"):
            raise UnsupportedArchitecture("mlp_bias is not implemented")
        moe = arch == "Qwen3MoeForCausalLM"
        if moe and (config.get("mlp_only_layers") or int(config.get("decoder_sparse_step") or 1) != 1):
            raise UnsupportedArchitecture(
                "mixing dense and MoE layers (mlp_only_layers, decoder_sparse_step != 1) "
                "is not implemented; every layer must be MoE"
            )
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        eos = config.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qk_norm=arch in QK_NORM_ARCHITECTURES,
            eos_token_ids=eos_ids,
            num_experts=num_experts(config) if moe else 0,
            num_experts_per_tok=int(config.get("num_experts_per_tok") or 0) if moe else 0,
            moe_intermediate_size=int(config.get("moe_intermediate_size") or 0) if moe else 0,
            norm_topk_prob=bool(config.get("norm_topk_prob", False)),
        )

    @classmethod
    def from_checkpoint(cls, model_dir: str | Path) -> ModelConfig:
        path = Path(model_dir) / "config.json"
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"cannot read {path}: {exc}") from None
        except KeyError as exc:
            raise CheckpointError(f"{path} lacks {exc}") from None

    def check_tensor_parallel(self, tp_size: int, ep_size: int = 1) -> None:
        """Refuse a tp (and ep) size that does not split heads, MLP or experts and vocabulary evenly, or
        whose KV heads neither split evenly nor replicate evenly (see ``sharding.kv_split``)."""
        layout = Layout(tp_size, ep_size=ep_size)  # ep must divide tp
        mlp = (
            (
                ("num_experts", self.num_experts, ep_size, "expert-parallel"),
                ("moe_intermediate_size", self.moe_intermediate_size, layout.moe_tp_size, "tensor-parallel (tp/ep)"),
            )
            if self.num_experts
            else (("intermediate_size", self.intermediate_size, tp_size, "tensor-parallel"),)
        )
        if ep_size > 1 and not self.num_experts:
            raise ShardingError(
                f"--ep-size {ep_size} needs a mixture-of-experts model; {self.architecture} has no "
                "experts, so use --ep-size 1"
            )
        for what, value, size, kind in (
            ("num_attention_heads", self.num_heads, tp_size, "tensor-parallel"),
            *mlp,
            ("vocab_size", self.vocab_size, tp_size, "tensor-parallel"),
        ):
            if value % size:
                raise ShardingError(f"{what}={value} is not divisible by {kind} size {size}")
        kv_split(self.num_kv_heads, tp_size, 0)

    def local_kv_heads(self, tp_size: int) -> int:
        """KV heads one rank holds: num_kv_heads / tp, or one replicated head when tp > num_kv_heads."""
        parts, _ = kv_split(self.num_kv_heads, tp_size, 0)
        return self.num_kv_heads // parts
