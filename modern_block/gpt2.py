"""The 2019 baseline: GPT-2's block and language model.

LayerNorm (with bias) before each sub-layer, multi-head causal attention with biases, a GELU MLP
with d_ff = 4d, learned absolute position embeddings added to the token embeddings, and an output
head tied to the token embedding. Everything the modern block later replaces is here.
"""

import torch
import torch.nn as nn

from ._validate import divisible, positive_int, token_ids
from .attention import causal_attention
from .ffn import GeluMLP
from .kv_cache import KVCache, LayerCache, kv_layer_cache, new_model_cache
from .params import count_parameters, init_gpt2_style


class CausalSelfAttention(nn.Module):
    """GPT-2 attention: one fused q/k/v projection with bias, n_heads heads, output projection."""

    def __init__(self, d: int, n_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        positive_int("d", d)
        positive_int("n_heads", n_heads)
        divisible("d", d, "n_heads", n_heads)
        self.h, self.dh, self.dropout = n_heads, d // n_heads, dropout
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:  # x: [B, T, d]
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)  # 3 × [B, h, T, dh]
        past = 0
        if cache is not None:
            k, v, past = cache.append(k, v)  # [B, h, past + T, dh]
        out = causal_attention(q, k, v, past, self.dropout if self.training else 0.0)  # [B, h, T, dh]
        return self.proj(out.transpose(1, 2).reshape(B, T, d))  # [B, T, d]

    def new_cache(self, batch: int, capacity: int, dtype=None, device=None) -> LayerCache:
        return kv_layer_cache(batch, self.h, self.dh, capacity, dtype=dtype, device=device)


class GPT2Block(nn.Module):
    """x + attn(LN(x)), then x + MLP(LN(x)): pre-norm, as GPT-2 (not post-norm as the 2017 paper)."""

    def __init__(self, d: int, n_heads: int, d_ff: int | None = None, *, bias: bool = True,
                 norm_eps: float = 1e-5, dropout: float = 0.0):
        super().__init__()
        self.ln1 = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.attn = CausalSelfAttention(d, n_heads, bias=bias, dropout=dropout)
        self.ln2 = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.mlp = GeluMLP(d, d_ff, bias=bias)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, cache: LayerCache | None = None) -> torch.Tensor:  # x: [B, T, d]
        x = x + self.drop(self.attn(self.ln1(x), cache))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT2LM(nn.Module):
    """GPT-2 language model; ``forward(idx)`` returns logits [B, T, V]."""

    def __init__(self, V: int, d: int = 256, n_layers: int = 4, n_heads: int = 8, max_len: int = 1024, *,
                 d_ff: int | None = None, bias: bool = True, tie: bool = True, norm_eps: float = 1e-5,
                 dropout: float = 0.0):
        super().__init__()
        for name, value in (("V", V), ("d", d), ("n_layers", n_layers), ("n_heads", n_heads), ("max_len", max_len)):
            positive_int(name, value)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.V, self.max_len = V, max_len
        self.wte = nn.Embedding(V, d)  # token embeddings
        self.wpe = nn.Embedding(max_len, d)  # learned absolute positions: at most max_len tokens
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(GPT2Block(d, n_heads, d_ff, bias=bias, norm_eps=norm_eps, dropout=dropout)
                                    for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.head = nn.Linear(d, V, bias=False)
        init_gpt2_style(self, n_layers)
        if tie:
            self.head.weight = self.wte.weight  # one matrix, two uses

    def forward(self, idx: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:  # idx: [B, T]
        start = cache.length if cache is not None else 0
        token_ids(idx, self.V, self.max_len, offset=start)
        T = idx.shape[1]
        pos = torch.arange(start, start + T, device=idx.device)  # [T]
        x = self.drop(self.wte(idx) + self.wpe(pos))  # [B, T, d]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache[i] if cache is not None else None)
        return self.head(self.ln_f(x))  # [B, T, V]

    def new_cache(self, batch: int, capacity: int, dtype=None, device=None) -> KVCache:
        """An empty cache for ``batch`` sequences of up to ``capacity`` tokens (K/V, or MLA latents)."""
        return new_model_cache(self, batch, capacity, dtype, device)

    def num_parameters(self) -> int:
        return count_parameters(self)
