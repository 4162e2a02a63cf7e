"""The 2019 baseline: GPT-2's block and language model.

LayerNorm (with bias) before each sub-layer, multi-head causal attention with biases, a GELU MLP
with d_ff = 4d, learned absolute position embeddings added to the token embeddings, and an output
head tied to the token embedding. Everything the modern block later replaces is here. The language
model is the course's one decoder skeleton (``decoder.py``) filled with these parts.
"""

from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from .causal import causal_attention
from .decoder import DecoderLM
from .validate import divisible, dropout_rate, positive_int, positive_ints


class CausalSelfAttention(nn.Module):
    """GPT-2 attention: one fused q/k/v projection with bias, n_heads heads, output projection."""

    def __init__(self, d: int, n_heads: int, bias: bool = True, dropout: float = 0.0):
        super().__init__()
        positive_ints(d=d, n_heads=n_heads)
        divisible("d", d, "n_heads", n_heads)
        self.h, self.dh, self.dropout = n_heads, d // n_heads, dropout_rate(dropout)
        self.qkv = nn.Linear(d, 3 * d, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.proj

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

    @property
    def out_proj(self) -> nn.Linear:
        """The projection that writes into the residual stream."""
        return self.proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [..., d]
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))  # [..., d_ff] -> [..., d]


class GPT2Block(nn.Module):
    """x + attn(LN(x)), then x + MLP(LN(x)): pre-norm, as GPT-2 (not post-norm as the 2017 paper).

    ``norm`` (a function of d) and ``mlp`` (a function of d and d_ff) replace the LayerNorms and the GELU MLP:
    lesson 08's ladder swaps in RMSNorm and SwiGLU one at a time."""

    def __init__(self, d: int, n_heads: int, d_ff: int | None = None, *, bias: bool = True,
                 norm_eps: float = 1e-5, dropout: float = 0.0, norm: Callable[[int], nn.Module] | None = None,
                 mlp: Callable[[int, int | None], nn.Module] | None = None):
        super().__init__()
        norm = norm or partial(nn.LayerNorm, eps=norm_eps, bias=bias)
        self.ln1 = norm(d)
        self.attn = CausalSelfAttention(d, n_heads, bias=bias, dropout=dropout)
        self.ln2 = norm(d)
        self.mlp = (mlp or partial(GeluMLP, bias=bias))(d, d_ff)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def residual_projections(self) -> list:
        """The linears that write into the residual stream (``params.init_gpt2_style`` starts them smaller)."""
        return [self.attn.out_proj, self.mlp.out_proj]

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:  # x: [B, T, d]
        x = x + self.drop(self.attn(self.ln1(x), cache))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT2LM(DecoderLM):
    """GPT-2 language model: the decoder (``decoder.DecoderLM``) with GPT-2's parts; ``forward(idx)`` returns
    logits [B, T, V]. The token embedding is ``emb``, the learned position table ``wpe``, the final LayerNorm
    ``norm`` (Hugging Face's and OpenAI's checkpoints call them wte, wpe and ln_f)."""

    def __init__(self, V: int, d: int = 256, n_layers: int = 4, n_heads: int = 8, max_len: int = 1024, *,
                 d_ff: int | None = None, bias: bool = True, tie: bool = True, norm_eps: float = 1e-5,
                 dropout: float = 0.0):
        positive_ints(V=V, d=d, n_layers=n_layers, n_heads=n_heads, max_len=max_len)
        super().__init__(
            emb=nn.Embedding(V, d),  # token embeddings
            wpe=nn.Embedding(max_len, d),  # learned absolute positions: at most max_len tokens
            blocks=[GPT2Block(d, n_heads, d_ff, bias=bias, norm_eps=norm_eps, dropout=dropout)
                    for _ in range(n_layers)],
            norm=nn.LayerNorm(d, eps=norm_eps, bias=bias),
            max_len=max_len, tie=tie, dropout=dropout)
