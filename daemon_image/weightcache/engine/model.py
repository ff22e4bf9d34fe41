"""The decoder forward pass over mapped weight views: Llama, Qwen2, Qwen3 and Qwen3-MoE, tensor-parallel.

Every weight is used where it lies — a view into the daemon's arena (or into the disk loader's
buffer) — and never copied: linears call ``F.linear`` on the view, and block-wise FP8 weights
are dequantized one block-row at a time into a temporary that lives for a single matmul. The
code follows transformers' modeling files operation for operation — RMSNorm in float32 cast back
before the weight multiplies, rotary tables in float32 cast to the activation dtype, residual adds
and lm_head in the activation dtype, the same SDPA call (see ``sdpa``) — so that it rounds where
transformers rounds: at TP=1 its logits equal transformers' in float32 within float32 rounding and
in bfloat16 exactly on CPU.

Tensor parallelism is Megatron's: q/k/v/gate/up are column-parallel (each rank owns whole heads
and a slice of the MLP; with more ranks than KV heads each KV head is replicated, see
``sharding.kv_split``), o/down are row-parallel and all-reduce their partial sums (in float32,
rounded once), and the embedding and lm_head are split by vocabulary rows. One all-reduce after
attention, one after the MLP, one in the embedding and one all-gather of the logits per forward.
A mixture-of-experts MLP (moe.py) is tensor- or expert-parallel as the layout says and ends in
the same all-reduce.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from weightcache_contract.errors import BindError, ShardingError

from ..checkpoints.quantization import SCALE_SUFFIX
from ..checkpoints.sharding import Layout
from ..gcpause import gc_paused
from .config import ModelConfig
from .moe import SparseMoe
from .parallel import Group


class Linear:
    """``y = x Wᵀ + b`` for a weight view; FP8 weights are dequantized per block-row on the fly."""

    def __init__(
        self,
        name: str,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        scale_inv: torch.Tensor | None = None,
        block: tuple[int, int] | None = None,
    ) -> None:
        self.name = name
        self.weight = weight
        self.bias = bias
        self.scale_inv = scale_inv
        self.block = block
        if weight.dtype == torch.float8_e4m3fn and (scale_inv is None or block is None):
            raise BindError(f"{name!r} is float8 but has no {SCALE_SUFFIX} or block size")

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale_inv is None:
            return F.linear(x, self.weight, self.bias)
        assert self.block is not None
        rows, cols = self.block
        in_features = self.weight.shape[1]
        out = torch.empty(*x.shape[:-1], self.out_features, dtype=x.dtype, device=x.device)
        for i, start in enumerate(range(0, self.out_features, rows)):
            stop = min(start + rows, self.out_features)
            # One block-row: (rows × in) float8 → float32 × its per-block scales → activation dtype.
            scale = self.scale_inv[i].repeat_interleave(cols)[:in_features]
            tile = (self.weight[start:stop].float() * scale).to(x.dtype)
            out[..., start:stop] = F.linear(x, tile)
        if self.bias is not None:
            out += self.bias
        return out


class RMSNorm:
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * wide.to(x.dtype)


class Rotary:
    """Default rotary embedding (no scaling): tables computed in float32 for the given positions."""

    def __init__(self, head_dim: int, theta: float) -> None:
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin


def sdpa(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, past: int, group: int, scale: float
) -> torch.Tensor:
    """Causal attention of ``q`` [heads, n, d] over ``keys``/``values`` [kv heads, past + n, d].

    The call is transformers' ``sdpa_attention_forward``, argument for argument, because in
    bfloat16 the kernel decides the rounding: a batched 4-D input, ``is_causal`` (not a mask) for a
    prefill, and grouped-query attention left to the kernel (``enable_gqa``) whenever no mask is
    needed. A 3-D input or an explicit causal mask picks another kernel (measured on CPU), whose
    bf16 output differs from transformers' by a bf16 step per head — enough, summed over layers,
    to change a greedy token. Only a prefill after earlier tokens (not what the scheduler does,
    but what the KV-cache tests do) needs a mask, and then, as transformers does, repeated kv heads.
    """
    n = q.shape[1]
    mask, causal, kwargs = None, False, {}
    if n > 1 and past == 0:
        causal = True
    elif n > 1:  # query i sits at position past+i and sees keys 0..past+i
        mask = torch.ones(n, past + n, dtype=torch.bool, device=q.device).tril(diagonal=past)
    if group > 1:  # GQA: kv head j serves query heads [j·group, (j+1)·group)
        if mask is None and keys.shape[-1] <= 256:
            kwargs["enable_gqa"] = True
        else:
            keys = keys.repeat_interleave(group, dim=0)
            values = values.repeat_interleave(group, dim=0)
    out = F.scaled_dot_product_attention(
        q[None], keys[None], values[None], attn_mask=mask, is_causal=causal, scale=scale, **kwargs
    )
    return out[0]


@dataclass
class KVCache:
    """One request's keys and values on one rank: [layers, local kv heads, capacity, head_dim]."""

    keys: torch.Tensor
    values: torch.Tensor
    length: int = 0

    @classmethod
    def allocate(
        cls,
        layers: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        shape = (layers, kv_heads, capacity, head_dim)
        return cls(torch.empty(shape, dtype=dtype, device=device), torch.empty(shape, dtype=dtype, device=device))

    @property
    def capacity(self) -> int:
        return self.keys.shape[2]


_MATERIALISING = threading.Lock()


class DecoderLayer:
    """One decoder layer, bound lazily: its views and modules are made on first use — the first
    forward through it, or the first read of a weight attribute — so an engine's bind costs no
    torch object per tensor and each layer pays for its own on first use. ``Model`` checks every
    layer's weights when it is made (``_check_layers``), so a wrong weight fails the bind, not a
    forward."""

    input_norm: RMSNorm
    post_norm: RMSNorm
    q: Linear
    k: Linear
    v: Linear
    o: Linear
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    moe: SparseMoe | None
    mlp: list[Linear]

    def __init__(self, index: int, cfg: ModelConfig, group: Group, get: _Getter, ep_size: int = 1) -> None:
        self.index = index
        self.group = group
        self.heads = cfg.num_heads // group.size
        self.kv_heads = cfg.local_kv_heads(group.size)
        self.head_dim = cfg.head_dim
        self.materialise_seconds = 0.0
        self._cfg, self._ep_size = cfg, ep_size
        self._get: _Getter | None = get  # the model checks every layer's weights before any is used

    def _weights(self, get: _Getter) -> dict[str, object]:
        """The layer's weight attributes, built from whatever ``get`` hands out (tensors or specs)."""
        cfg, p = self._cfg, f"model.layers.{self.index}."
        w: dict[str, object] = {
            "input_norm": RMSNorm(get(p + "input_layernorm.weight"), cfg.rms_norm_eps),
            "post_norm": RMSNorm(get(p + "post_attention_layernorm.weight"), cfg.rms_norm_eps),
            "q": get.linear(p + "self_attn.q_proj", (self.heads * cfg.head_dim, cfg.hidden_size)),
            "k": get.linear(p + "self_attn.k_proj", (self.kv_heads * cfg.head_dim, cfg.hidden_size)),
            "v": get.linear(p + "self_attn.v_proj", (self.kv_heads * cfg.head_dim, cfg.hidden_size)),
            "o": get.linear(p + "self_attn.o_proj", (cfg.hidden_size, self.heads * cfg.head_dim)),
            "q_norm": RMSNorm(get(p + "self_attn.q_norm.weight"), cfg.rms_norm_eps) if cfg.qk_norm else None,
            "k_norm": RMSNorm(get(p + "self_attn.k_norm.weight"), cfg.rms_norm_eps) if cfg.qk_norm else None,
            "moe": None,
            "mlp": [],
        }
        if cfg.num_experts:
            w["moe"] = SparseMoe(
                p + "mlp.", cfg, Layout(self.group.size, self.group.rank, ep_size=self._ep_size), get, get.block
            )
        else:
            inter = cfg.intermediate_size // self.group.size
            w["mlp"] = [
                get.linear(p + "mlp.gate_proj", (inter, cfg.hidden_size)),
                get.linear(p + "mlp.up_proj", (inter, cfg.hidden_size)),
                get.linear(p + "mlp.down_proj", (cfg.hidden_size, inter)),
            ]
        return w

    def materialise(self) -> None:
        """Make this layer's views and modules now (once; later calls do nothing)."""
        # A second thread reading a weight meanwhile waits on the lock, then finds it; the collector
        # is paused as for eager views (see gcpause): nothing made here is garbage.
        with _MATERIALISING, gc_paused():
            get = self.__dict__.pop("_get", None)
            if get is None:
                return
            started = time.perf_counter()
            self.__dict__.update(self._weights(get.checked()))
            self.materialise_seconds = time.perf_counter() - started

    def __getattr__(self, name: str) -> object:
        # Reached only for attributes not set yet: the weights of a layer not yet materialised.
        if not name.startswith("__"):
            self.materialise()
            if name in self.__dict__:
                return self.__dict__[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def linears(self) -> list[Linear]:
        return [self.q, self.k, self.v, self.o, *self.mlp]

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        x = x + self.attention(self.input_norm(x), cos, sin, cache)
        h = self.post_norm(x)
        if self.moe is not None:
            return x + self.group.all_reduce(self.moe(h))
        gate, up, down = self.mlp
        return x + self.group.all_reduce(down(F.silu(gate(h)) * up(h)))

    def attention(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: KVCache) -> torch.Tensor:
        n = x.shape[0]
        q = self.q(x).view(n, self.heads, self.head_dim)
        k = self.k(x).view(n, self.kv_heads, self.head_dim)
        v = self.v(x).view(n, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = Rotary.apply(q.transpose(0, 1), cos, sin)  # [heads, n, head_dim]
        k = Rotary.apply(k.transpose(0, 1), cos, sin)
        past = cache.length
        cache.keys[self.index, :, past : past + n] = k
        cache.values[self.index, :, past : past + n] = v.transpose(0, 1)
        keys = cache.keys[self.index, :, : past + n]
        values = cache.values[self.index, :, : past + n]
        out = sdpa(q, keys, values, past, self.heads // self.kv_heads, self.head_dim**-0.5)
        return self.group.all_reduce(self.o(out.transpose(0, 1).reshape(n, self.heads * self.head_dim)))


class _Getter:
    """Looks tensors up by checkpoint name, following aliases, and checks shapes as it goes.

    ``specs()`` gives a getter that checks the same way but hands out ``TensorSpec``s (shape and
    dtype from a ``TensorIndex``, no view made) where the tensors allow it; both record what
    they were asked for in one ``used`` set.
    """

    def __init__(
        self,
        tensors: Mapping[str, torch.Tensor],
        aliases: Mapping[str, str],
        block: tuple[int, int] | None,
        used: set[str] | None = None,
        look: Callable[[str], Any] | None = None,
    ) -> None:
        self.tensors = tensors
        self.aliases = aliases
        self.block = block
        self.used: set[str] = set() if used is None else used
        self._look = look or tensors.__getitem__

    def specs(self) -> _Getter:
        """A getter that checks as this one does but hands out specs and records what it is asked."""
        # A plain dict (the disk path) holds real tensors already: they serve as their own specs.
        getter = _Getter(self.tensors, self.aliases, self.block, self.used, getattr(self.tensors, "spec", None))
        getter.asked = []
        return getter

    asked: list[str] | None = None  # names asked for, present or not (a ``specs`` getter only)

    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        key = self.aliases.get(name, name)
        if self.asked is not None:
            self.asked.append(name)
        if key not in self.tensors:
            raise BindError(f"the weights lack {name!r}; they do not belong to this model or layout")
        tensor = self._look(key)
        if shape is not None and tuple(tensor.shape) != shape:
            raise BindError(f"{name!r} has shape {tuple(tensor.shape)}, the model needs {shape}")
        self.used.add(key)
        return tensor

    def optional(self, name: str) -> torch.Tensor | None:
        if self.aliases.get(name, name) in self.tensors:
            return self(name)
        if self.asked is not None:
            self.asked.append(name)
        return None

    def checked(self) -> _Getter:
        """A getter for weights the model has checked already: lookups only (a layer's first use)."""
        return _CheckedGetter(self.tensors, self.aliases, self.block, self.used)

    def linear(self, prefix: str, shape: tuple[int, int]) -> Linear:
        weight = self(prefix + ".weight", shape)
        scale = self.optional(prefix + ".weight" + SCALE_SUFFIX)
        return Linear(prefix, weight, self.optional(prefix + ".bias"), scale, self.block if scale is not None else None)


def _check_layers(layers: list[DecoderLayer], get: _Getter) -> None:
    """Every check the layers' first forwards would make, made now without a view.

    Layer 0 runs its constructor on specs (names, shapes, FP8 scales: the checks the bound layer
    makes), recording every name it asks for. Every other layer must then hold the same tensors,
    with layer 0's shapes and dtypes, and no optional one (bias, scale) that layer 0 lacks — which
    is all its constructor could check. Per tensor that is a lookup and a comparison, not a
    constructor call: at 20,000 tensors the difference is most of the bind.
    """
    if not layers:
        return
    specs = get.specs()
    layers[0]._weights(specs)
    assert specs.asked is not None
    first = "model.layers.0."
    suffixes = [name[len(first) :] for name in specs.asked]
    if any(not name.startswith(first) for name in specs.asked):
        raise BindError(f"layer 0 asked for weights outside {first!r}: the layer check cannot generalise")
    resolve, tensors, aliases = get.aliases.get, get.tensors, bool(get.aliases)
    held = [s for s in suffixes if resolve(first + s, first + s) in tensors]
    prefixes = [f"model.layers.{layer.index}." for layer in layers[1:]]
    for suffix in held:
        like = resolve(first + suffix, first + suffix)
        names = [prefix + suffix for prefix in prefixes]
        keys = [resolve(n, n) for n in names] if aliases else names
        bad = _first_unlike(tensors, keys, like)
        if bad is not None:
            name = names[keys.index(bad)]
            if bad not in tensors:
                raise BindError(f"the weights lack {name!r}; they do not belong to this model or layout")
            raise BindError(
                f"{name!r} has {_describe(tensors, bad)}, the model needs {_describe(tensors, like)} "
                f"(as checked for {first + suffix!r}): every layer holds the same tensors"
            )
        get.used.update(keys)


def _first_unlike(tensors: Mapping[str, torch.Tensor], keys: list[str], like: str) -> str | None:
    """The first of ``keys`` missing or of another shape or dtype than ``like``, if any."""
    unlike = getattr(tensors, "first_unlike", None)
    if unlike is not None:  # a TensorIndex answers from its columns, without a view
        found: str | None = unlike(keys, like)
        return found
    want = tensors[like]
    for key in keys:
        tensor = tensors.get(key)
        if tensor is None or tensor.shape != want.shape or tensor.dtype != want.dtype:
            return key
    return None


def _describe(tensors: Mapping[str, torch.Tensor], key: str) -> str:
    spec = getattr(tensors, "spec", None)
    shape, dtype = spec(key) if spec is not None else (tuple(tensors[key].shape), tensors[key].dtype)
    return f"{dtype} {tuple(shape)}"


class _CheckedGetter(_Getter):
    # Per tensor, the checks cost more than the view itself; ``_check_layers`` made them at bind.
    def __call__(self, name: str, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        return self.tensors[self.aliases.get(name, name)]

    def optional(self, name: str) -> torch.Tensor | None:
        key = self.aliases.get(name, name)
        return self.tensors[key] if key in self.tensors else None


class Model:
    """One rank's share of the decoder; ``forward`` appends to a request's KV cache."""

    def __init__(
        self,
        cfg: ModelConfig,
        tensors: Mapping[str, torch.Tensor],
        aliases: Mapping[str, str],
        group: Group,
        block: tuple[int, int] | None = None,
        ep_size: int = 1,
    ) -> None:
        try:
            cfg.check_tensor_parallel(group.size, ep_size)
        except ShardingError as exc:
            raise BindError(str(exc)) from None
        self.cfg = cfg
        self.group = group
        get = _Getter(tensors, aliases, block)
        vocab_part = cfg.vocab_size // group.size
        self.vocab_start = group.rank * vocab_part
        self.embed = get("model.embed_tokens.weight", (vocab_part, cfg.hidden_size))
        self.dtype = self.embed.dtype
        self.device = self.embed.device  # the engine computes where the weights are: CPU or the mapped GPU
        with gc_paused():
            self.layers = [DecoderLayer(i, cfg, group, get, ep_size) for i in range(cfg.num_layers)]
            _check_layers(self.layers, get)
        self.norm = RMSNorm(get("model.norm.weight"), cfg.rms_norm_eps)
        self.lm_head = Linear("lm_head", get("lm_head.weight", (vocab_part, cfg.hidden_size)))
        self.rotary = Rotary(cfg.head_dim, cfg.rope_theta)
        self.keep_alive: object = None  # whatever owns the memory the weight views point into
        # ``used`` holds only names found in ``tensors``: equal counts mean none is left over.
        unused = sorted(set(tensors) - get.used) if len(get.used) != len(tensors) else []
        if unused:
            raise BindError(f"{len(unused)} weight(s) have no place in the model, e.g. {unused[0]!r}")

    def materialise(self) -> float:
        """Make every layer's views now (what the first forward would do); the seconds all layers
        have spent on it so far, now included."""
        with gc_paused():
            for layer in self.layers:
                layer.materialise()
        return self.materialise_seconds

    @property
    def materialise_seconds(self) -> float:
        """Seconds spent making layers' views and modules, summed over the layers made so far."""
        return sum(layer.materialise_seconds for layer in self.layers)

    def weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor the forward pass reads, by name (for zero-copy checks); materialises every layer."""
        yield "model.embed_tokens.weight", self.embed
        for layer in self.layers:
            p = f"model.layers.{layer.index}."
            for lin in layer.linears():
                yield lin.name + ".weight", lin.weight
                if lin.bias is not None:
                    yield lin.name + ".bias", lin.bias
                if lin.scale_inv is not None:
                    yield lin.name + ".weight" + SCALE_SUFFIX, lin.scale_inv
            if layer.moe is not None:
                yield from layer.moe.tensors()
            yield p + "input_layernorm.weight", layer.input_norm.weight
            yield p + "post_attention_layernorm.weight", layer.post_norm.weight
            if layer.q_norm is not None and layer.k_norm is not None:
                yield p + "self_attn.q_norm.weight", layer.q_norm.weight
                yield p + "self_attn.k_norm.weight", layer.k_norm.weight
        yield "model.norm.weight", self.norm.weight
        yield "lm_head.weight", self.lm_head.weight

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.allocate(
            self.cfg.num_layers,
            self.cfg.local_kv_heads(self.group.size),
            capacity,
            self.cfg.head_dim,
            self.dtype,
            self.device,
        )

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        if self.group.size == 1:
            return F.embedding(ids, self.embed)
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.embed.shape[0])
        rows = F.embedding(local.clamp(0, self.embed.shape[0] - 1), self.embed)
        return self.group.all_reduce(rows * inside[:, None].to(rows.dtype))

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, cache: KVCache, all_logits: bool = False) -> torch.Tensor:
        """Logits (full vocabulary, float32) for the last token, or for every token if asked."""
        n = ids.shape[0]
        if cache.length + n > cache.capacity:
            raise ValueError(f"KV cache of {cache.capacity} positions cannot take {cache.length} + {n}")
        ids = ids.to(self.device)
        positions = torch.arange(cache.length, cache.length + n, device=self.device)
        cos, sin = self.rotary.tables(positions, self.dtype)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        cache.length += n
        x = self.norm(x if all_logits else x[-1:])
        return self.group.all_gather(self.lm_head(x), dim=-1).float()
