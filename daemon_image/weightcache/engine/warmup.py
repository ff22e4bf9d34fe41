"""The GPU's first-launch costs, paid on a thread beside the start instead of in the first forward.

With CUDA's lazy module loading (the default) each kernel's first launch loads its module, and the
first matmul loads cuBLAS and picks its kernels: on an H200 the engine's first real forward took
~0.5 s of a ~2.3 s start that way (the first bf16 matmul 0.09–0.12 s, the first SDPA 0.06–0.08 s).
Right after ``import torch`` the start still has the engine's other imports, the HTTP server,
distributed init and the mapping of the weights ahead of it, none of which needs the GPU; so
``start`` runs one tiny forward of the same operators, in the same dtypes and at the weights'
per-rank shapes (cuBLAS and SDPA pick kernels by shape), on scratch tensors, on a daemon thread.
torch drops the GIL inside its operators, so the imports go on meanwhile. The real warm-up then
finds the modules loaded. Nothing here touches the model, its weights or the KV cache: tokens
cannot change. On CPU there is nothing to load, and ``start`` does nothing.

Keep the operator list in step with ``model.py`` (RMSNorm, Rotary, ``sdpa``, the MLP) and the
scheduler's sampling; an operator missed here is only paid for later, as before. This module
imports torch alone (and ``config`` for its type), so the thread can start before the rest of the
engine is imported.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from .config import ModelConfig

log = logging.getLogger("weightcache.engine")

PROMPT_TOKENS = 4  # the start's real warm-up prompt (rank._warm_up): a 4-token prefill, then decodes
LM_HEAD_BYTES = 256 << 20  # scratch lm_head rows at most (its shape picks the biggest matmul's kernel)


def start(cfg: ModelConfig, tp_size: int, dtype: str, device: str) -> threading.Thread | None:
    """Start the warm-up thread on a CUDA engine; ``None`` (and no thread) anywhere else."""
    if device != "cuda":
        return None
    thread = threading.Thread(target=_quietly, args=(cfg, tp_size, dtype), name="warm-kernels", daemon=True)
    thread.start()
    return thread


def _quietly(cfg: ModelConfig, tp_size: int, dtype: str) -> None:
    try:
        torch.cuda.set_device(0)  # as rank._start does: the launcher leaves each rank one visible GPU
        run(cfg, tp_size, getattr(torch, dtype), "cuda")
        torch.cuda.synchronize()
        torch.cuda.empty_cache()  # give the scratch tensors' memory back
    except Exception:  # noqa: BLE001 - the real warm-up's forward reports any CUDA problem by name
        log.debug("kernel warm-up failed", exc_info=True)


@torch.inference_mode()
def run(cfg: ModelConfig, tp_size: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    """One decoder layer, the final norm, lm_head and sampling, at this rank's shapes: a prefill of
    ``PROMPT_TOKENS`` and one decode step. Returns the decode step's token (for tests)."""
    heads, kv_heads, d = cfg.num_heads // tp_size, cfg.local_kv_heads(tp_size), cfg.head_dim
    hidden, inter = cfg.hidden_size, max(1, (cfg.moe_intermediate_size or cfg.intermediate_size) // tp_size)
    vocab = max(1, min(cfg.vocab_size // tp_size, LM_HEAD_BYTES // (hidden * dtype.itemsize)))

    def w(*shape: int) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=device).normal_(0, 0.02)

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # model.RMSNorm
        wide = x.float()
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
        return weight * wide.to(x.dtype)

    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:  # model.Rotary.apply
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    embed = lm_head = w(vocab, hidden)  # (one scratch table: the embedding's kernel ignores its shape)
    wq, wk, wv, wo = w(heads * d, hidden), w(kv_heads * d, hidden), w(kv_heads * d, hidden), w(hidden, heads * d)
    gate, up, down, ln, qk_ln = w(inter, hidden), w(inter, hidden), w(hidden, inter), w(hidden), w(d)
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d)).to(device)
    keys = torch.empty((kv_heads, PROMPT_TOKENS + 1, d), dtype=dtype, device=device)
    values = torch.empty_like(keys)
    token = torch.zeros((), dtype=torch.int64)
    for past, n in ((0, PROMPT_TOKENS), (PROMPT_TOKENS, 1)):  # prefill (causal), then decode (no mask)
        ids = torch.arange(n, device=device) % vocab
        freqs = torch.arange(past, past + n, device=device).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        x = F.embedding(ids, embed)
        h = norm(x, ln)
        q, k = F.linear(h, wq).view(n, heads, d), F.linear(h, wk).view(n, kv_heads, d)
        v = F.linear(h, wv).view(n, kv_heads, d)
        if cfg.qk_norm:
            q, k = norm(q, qk_ln), norm(k, qk_ln)
        q, k = rotate(q.transpose(0, 1), cos, sin), rotate(k.transpose(0, 1), cos, sin)
        keys[:, past : past + n], values[:, past : past + n] = k, v.transpose(0, 1)
        group = heads // kv_heads
        extra = {"enable_gqa": True} if group > 1 and d <= 256 else {}  # as model.sdpa without a mask
        kv_k, kv_v = keys[:, : past + n], values[:, : past + n]
        if group > 1 and not extra:
            kv_k, kv_v = kv_k.repeat_interleave(group, dim=0), kv_v.repeat_interleave(group, dim=0)
        out = F.scaled_dot_product_attention(q[None], kv_k[None], kv_v[None], is_causal=n > 1, scale=d**-0.5, **extra)
        out = out[0]
        x = x + F.linear(out.transpose(0, 1).reshape(n, heads * d), wo)
        h = norm(x, ln)
        x = x + F.linear(F.silu(F.linear(h, gate)) * F.linear(h, up), down)
        logits = F.linear(norm(x[-1:], ln), lm_head).float()
        token = logits[0].argmax()  # the scheduler's greedy pick, and its sampling's softmax
        torch.softmax(logits[0] / 0.7, dim=-1)
    return token.cpu()
