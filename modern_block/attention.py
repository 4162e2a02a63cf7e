"""Causal self-attention with fewer key/value heads than query heads: MHA, MQA and GQA in one module.

    MHA: n_kv_heads == n_heads   every query head has its own K and V
    GQA: 1 < n_kv_heads < h      h / n_kv query heads share each K/V head (grouped, not tiled:
                                 query head j reads KV head j // (h / n_kv))
    MQA: n_kv_heads == 1         all query heads share one K/V head

Only the K and V projections (and the cache) shrink; every query head still computes its scores.
Optional QK-norm (Qwen3, OLMo 2, Gemma 3) normalises each head's q and k, before RoPE.
The three projections ``wq``, ``wk``, ``wv`` run as one matmul over their stacked weights
(``packed.py``); the result is the same as calling them one by one.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from ._validate import divisible, even, positive_int
from .kv_cache import LayerCache, kv_layer_cache
from .packed import stacked_weight
from .rmsnorm import RMSNorm
from .rope import apply_rope


def causal_attention(q, k, v, past_len: int = 0, dropout_p: float = 0.0, scale: float | None = None):
    """Fused causal attention of T new queries over past_len cached + T new keys.

    q: [B, h, T, dq]; k: [B, n_kv, past_len + T, dq]; v: [B, n_kv, past_len + T, dv].
    Query i (at position past_len + i) sees keys 0 .. past_len + i. K/V heads are shared by groups
    of h / n_kv query heads inside the kernel, without copying them per query head.
    """
    T, S = q.shape[-2], k.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    if past_len == 0:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=gqa)  # [B, h, T, dv]
    if T == 1:  # one new token sees everything held: no mask needed
        if gqa:  # decoding: the rep query heads of a group become rep "queries" of their KV head
            B, h, _, dq = q.shape
            out = F.scaled_dot_product_attention(q.view(B, k.shape[1], h // k.shape[1], dq), k, v,
                                                 dropout_p=dropout_p, scale=scale)  # [B, n_kv, rep, dv]
            return out.view(B, h, 1, v.shape[-1])  # [B, h, 1, dv]
        mask = None
    else:  # a chunk after a prefix: causal within the chunk, full over the prefix
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past_len)  # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=gqa)  # [B, h, T, dv]


class GQAttention(nn.Module):
    """Grouped-query attention with RoPE, optional QK-norm and a KV cache.

    ``head_dim`` defaults to d / n_heads; it may be set explicitly so that heads × head_dim differs
    from d (Qwen3-0.6B: 16 heads × 128 = 2048 with d = 1024). ``qkv_bias=True`` gives the q, k and v
    projections biases (Qwen2/Qwen2.5); the modern block has none by default.
    """

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, qk_norm: bool = True, *,
                 head_dim: int | None = None, norm_eps: float = 1e-6, dropout: float = 0.0,
                 qkv_bias: bool = False):
        super().__init__()
        positive_int("d", d)
        positive_int("n_heads", n_heads)
        positive_int("n_kv_heads", n_kv_heads)
        if head_dim is None:
            divisible("d", d, "n_heads", n_heads)
            head_dim = d // n_heads
        positive_int("head_dim", head_dim)
        divisible("n_heads", n_heads, "n_kv_heads", n_kv_heads)
        even("head_dim", head_dim, "for RoPE (dimensions are rotated in pairs)")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.h, self.kv, self.dh = n_heads, n_kv_heads, head_dim
        self.rope_dim = head_dim  # the whole head is rotated
        self.qk_norm = qk_norm
        self.dropout = dropout
        self.wq = nn.Linear(d, n_heads * head_dim, bias=qkv_bias)
        self.wk = nn.Linear(d, n_kv_heads * head_dim, bias=qkv_bias)  # fewer K/V heads
        self.wv = nn.Linear(d, n_kv_heads * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_heads * head_dim, d, bias=False)
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: LayerCache | None = None) -> torch.Tensor:  # x: [B, T, d]
        B, T, _ = x.shape
        h, kv = self.h, self.kv
        stacked = stacked_weight(self, ("wq", "wk", "wv"), with_autograd=True)
        if stacked is not None:  # one matmul over [W_q; W_k; W_v]: [(h + 2kv)·dh, d]
            qkv = F.linear(x, stacked)  # [B, T, (h + 2kv)·dh]
        else:  # hooks on the projections: call each as a module
            qkv = torch.cat([self.wq(x), self.wk(x), self.wv(x)], dim=-1)  # [B, T, (h + 2kv)·dh]
        qkv = qkv.view(B, T, h + 2 * kv, self.dh).transpose(1, 2)  # [B, h + 2kv, T, dh]: q, k, v heads
        if self.qk_norm:
            q, k, v = qkv.split_with_sizes([h, kv, kv], dim=1)  # [B, h | kv | kv, T, dh]
            q, k = self.q_norm(q), self.k_norm(k)  # QK-norm per head, before RoPE
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # positions by rotation
        else:  # q and k heads take the same rotation: rotate them together
            qk, v = qkv.split_with_sizes([h + kv, kv], dim=1)  # [B, h + kv, T, dh], [B, kv, T, dh]
            q, k = apply_rope(qk, cos, sin).split_with_sizes([h, kv], dim=1)  # positions by rotation
        past = 0
        if cache is not None:
            k, v, past = cache.append(k, v)  # [B, kv, past + T, dh] each
        out = causal_attention(q, k, v, past, self.dropout if self.training else 0.0)  # [B, h, T, dh]
        return self.wo(out.transpose(1, 2).reshape(B, T, self.h * self.dh))  # [B, T, d]

    def new_cache(self, batch: int, capacity: int, dtype=None, device=None) -> LayerCache:
        return kv_layer_cache(batch, self.kv, self.dh, capacity, dtype=dtype, device=device)
