"""The 2019 baseline: GPT-2's block and language model.

LayerNorm (with bias) before each sub-layer, multi-head causal attention with biases, a GELU MLP
with d_ff = 4d, learned absolute position embeddings added to the token embeddings, and an output
head tied to the token embedding. Everything the modern block later replaces is here.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from .params import count_parameters, init_gpt2_style
from .validate import divisible, positive_int, token_ids


def causal_attention(q, k, v, past_len: int = 0, dropout_p: float = 0.0, scale: float | None = None):
    """softmax(q·kᵀ · scale + causal mask) · v, fused (``F.scaled_dot_product_attention``).

    q: [B, h, T, dq] for T new tokens; k: [B, n_kv, S, dq] and v: [B, n_kv, S, dv] for all S = past_len + T
    tokens (past_len > 0 when earlier ones come from a KV cache). New token i sits at position
    past_len + i and sees keys 0 .. past_len + i. Fewer K/V heads than query heads (GQA, lesson 04)
    are shared by groups of h / n_kv query heads. The scale defaults to 1/sqrt(dq).
    """
    T, S = q.shape[-2], k.shape[-2]
    grouped = q.shape[1] != k.shape[1]
    if past_len == 0:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale,
                                              enable_gqa=grouped)  # [B, h, T, dv]
    if T == 1:  # one new token (a decoding step) sees every key: nothing to mask
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale, enable_gqa=grouped)
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=past_len)  # [T, S]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale,
                                          enable_gqa=grouped)  # [B, h, T, dv]


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

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:  # x: [B, T, d]
        """``cache``: the layer's ``kv_cache.LayerCache`` when decoding (lesson 04), else None."""
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)  # 3 × [B, h, T, dh]
        past = 0
        if cache is not None:
            k, v, past = cache.append(k, v)  # [B, h, past + T, dh]: every token so far
        out = causal_attention(q, k, v, past, self.dropout if self.training else 0.0)  # [B, h, T, dh]
        return self.proj(out.transpose(1, 2).reshape(B, T, d))  # [B, T, d]


class GeluMLP(nn.Module):
    """GPT-2's MLP: expand to d_ff (4d by default), GELU with the tanh approximation, project back."""

    def __init__(self, d: int, d_ff: int | None = None, bias: bool = True):
        super().__init__()
        positive_int("d", d)
        d_ff = 4 * d if d_ff is None else positive_int("d_ff", d_ff)
        self.fc = nn.Linear(d, d_ff, bias=bias)
        self.proj = nn.Linear(d_ff, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # [..., d_ff] -> [..., d]


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

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:  # x: [B, T, d]
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

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:  # idx: [B, T]
        """Logits for ``idx``. With a ``cache`` (a ``kv_cache.KVCache``), idx continues the sequences it holds."""
        start = 0 if cache is None else cache.length
        token_ids(idx, self.V, self.max_len, offset=start, cache=cache, n_layers=len(self.blocks))
        T = idx.shape[1]
        pos = torch.arange(start, start + T, device=idx.device)  # [T]
        x = self.drop(self.wte(idx) + self.wpe(pos))  # [B, T, d]
        for i, blk in enumerate(self.blocks):
            x = blk(x, None if cache is None else cache[i])
        return self.head(self.ln_f(x))  # [B, T, V]

    def num_parameters(self) -> int:
        return count_parameters(self)
