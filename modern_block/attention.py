"""Causal self-attention with fewer key/value heads than query heads: MHA, MQA and GQA in one module.

    MHA: n_kv_heads == n_heads   every query head has its own K and V
    GQA: 1 < n_kv_heads < h      h / n_kv query heads share each K/V head (grouped, not tiled:
                                 query head j reads KV head j // (h / n_kv))
    MQA: n_kv_heads == 1         all query heads share one K/V head

Only the K and V projections (and the cache) shrink; every query head still computes its scores.
Optional QK-norm (Qwen3, OLMo 2, Gemma 3) normalises each head's q and k, before RoPE.
"""

import torch
import torch.nn as nn

from .causal import causal_attention
from .rmsnorm import RMSNorm
from .rope import apply_rope
from .validate import divisible, dropout_rate, even, positive_ints


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
        positive_ints(d=d, n_heads=n_heads, n_kv_heads=n_kv_heads)
        if head_dim is None:
            divisible("d", d, "n_heads", n_heads)
            head_dim = d // n_heads
        positive_ints(head_dim=head_dim)
        divisible("n_heads", n_heads, "n_kv_heads", n_kv_heads)
        even("head_dim", head_dim, "for RoPE (dimensions are rotated in pairs)")
        self.h, self.kv, self.dh = n_heads, n_kv_heads, head_dim
        self.qk_norm, self.dropout = qk_norm, dropout_rate(dropout)
        self.wq = nn.Linear(d, n_heads * head_dim, bias=qkv_bias)
        self.wk = nn.Linear(d, n_kv_heads * head_dim, bias=qkv_bias)  # fewer K/V heads
        self.wv = nn.Linear(d, n_kv_heads * head_dim, bias=qkv_bias)
        self.wo = nn.Linear(n_heads * head_dim, d, bias=False)
        # QK-norm: one RMSNorm over each head's q and one over its k (identities without it)
        self.q_norm = RMSNorm(head_dim, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(head_dim, norm_eps) if qk_norm else nn.Identity()

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.wo

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x: [B, T, d]; cos, sin: RoPE tables [T, dh/2] or [B, T, dh/2]; cache: a ``kv_cache.LayerCache`` or None."""
        B, T, _ = x.shape
        q, k, v = self.project(x)  # [B, h, T, dh], [B, kv, T, dh], [B, kv, T, dh]
        q, k = self.q_norm(q), self.k_norm(k)  # QK-norm (if on): each head's q and k, before RoPE
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # positions enter by rotation
        past = 0
        if cache is not None:
            k, v, past = cache.append(k, v)  # [B, kv, past + T, dh]: every token so far
        out = causal_attention(q, k, v, past, self.dropout if self.training else 0.0)  # [B, h, T, dh]
        return self.wo(out.transpose(1, 2).reshape(B, T, self.h * self.dh))  # [B, T, d]

    def project(self, x: torch.Tensor):
        """q, k and v of x [B, T, d], split into heads (the fast layer does this with one matrix)."""
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.h, self.dh).transpose(1, 2)  # [B, h, T, dh]
        k = self.wk(x).view(B, T, self.kv, self.dh).transpose(1, 2)  # [B, kv, T, dh]
        v = self.wv(x).view(B, T, self.kv, self.dh).transpose(1, 2)  # [B, kv, T, dh]
        return q, k, v
