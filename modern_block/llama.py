"""The modern block and the Llama-style language model built from it.

    x ─► RMSNorm ─► attention (GQA, RoPE, optional QK-norm) ─► + ─► RMSNorm ─► SwiGLU ─► + ─►

Pre-norm residuals, no biases, no position embedding (RoPE rotates q and k inside attention),
and an output head that may share the embedding matrix (``tie=True``). With ``mla=MLAConfig(...)``
the attention is DeepSeek's multi-head latent attention (lesson 05) instead of GQA.
"""

from collections.abc import Callable
from functools import partial

import torch
import torch.nn as nn

from .attention import GQAttention
from .decoder import DecoderLM
from .ffn import SwiGLU
from .mla import MLAConfig, MLAttention
from .rmsnorm import RMSNorm
from .rope import RotaryEmbedding
from .validate import positive_ints


class Block(nn.Module):
    """x + attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)).

    ``norm`` (a function of d) and ``ffn`` (a function of d and d_ff) replace the RMSNorms and SwiGLU: lesson
    08's leave-one-out models swap GPT-2's LayerNorm and GELU MLP back in."""

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, d_ff: int, *, qk_norm: bool = True,
                 norm_eps: float = 1e-6, head_dim: int | None = None, dropout: float = 0.0,
                 mla: MLAConfig | None = None, qkv_bias: bool = False, norm: Callable[[int], nn.Module] | None = None,
                 ffn: Callable[[int, int], nn.Module] = SwiGLU):
        super().__init__()
        norm = norm or partial(RMSNorm, eps=norm_eps)
        self.attn_norm, self.ffn_norm = norm(d), norm(d)
        self.attn: GQAttention | MLAttention
        if mla is None:
            self.attn = GQAttention(d, n_heads, n_kv_heads, qk_norm, head_dim=head_dim, norm_eps=norm_eps,
                                    dropout=dropout, qkv_bias=qkv_bias)
        else:
            self.attn = mla.build(d, n_heads, dropout)
        self.ffn = ffn(d, d_ff)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def residual_projections(self) -> list:
        """The linears that write into the residual stream (``decoder.init_gpt2_style`` starts them smaller)."""
        return [self.attn.out_proj, self.ffn.out_proj]

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x: [B, T, d]; cos, sin: the RoPE tables of these positions; cache: this layer's ``LayerCache`` or None."""
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class LlamaStyleLM(DecoderLM):
    """Llama/Qwen-style decoder: the decoder (``decoder.DecoderLM``) with RoPE, RMSNorm and these blocks;
    ``forward(idx)`` returns logits [B, T, V].

    Keyword options beyond the chapter's signature: ``qk_norm`` (the chapter's model has it, Llama
    proper does not), ``norm_eps``, ``head_dim`` (heads × head_dim may differ from d, as in Qwen3),
    ``dropout``, ``mla`` (an ``MLAConfig``: multi-head latent attention as in DeepSeek-V3;
    ``n_kv_heads``, ``head_dim`` and ``qk_norm`` then do not apply), ``qkv_bias`` (biases on q, k
    and v, as in Qwen2) and ``rope_scaling`` (a RoPE scaling dict for a longer context, see
    ``modern_block.rope``: linear, dynamic, yarn or llama3).
    """

    def __init__(self, V: int, d: int = 256, n_layers: int = 4, n_heads: int = 8, n_kv_heads: int = 2,
                 d_ff: int = 688, max_len: int = 1024, rope_base: float = 10000.0, tie: bool = False, *,
                 qk_norm: bool = True, norm_eps: float = 1e-6, head_dim: int | None = None,
                 dropout: float = 0.0, mla: MLAConfig | None = None, qkv_bias: bool = False,
                 rope_scaling: dict | None = None):
        positive_ints(V=V, d=d, n_layers=n_layers, n_heads=n_heads, max_len=max_len)  # before d // n_heads
        if mla is not None and not isinstance(mla, MLAConfig):
            raise TypeError(f"mla must be an MLAConfig, got {type(mla).__name__}")
        rope = RotaryEmbedding(mla.rope_dim if mla else head_dim or d // n_heads,  # the rotated part of a head
                               max_len, rope_base, rope_scaling)
        super().__init__(
            emb=nn.Embedding(V, d),  # no position embedding: RoPE rotates q and k inside attention
            blocks=[Block(d, n_heads, n_kv_heads, d_ff, qk_norm=qk_norm, norm_eps=norm_eps, head_dim=head_dim,
                          dropout=dropout, mla=mla, qkv_bias=qkv_bias) for _ in range(n_layers)],
            norm=RMSNorm(d, norm_eps),
            rope=rope, max_len=max_len, tie=tie, dropout=dropout)
        self.rope_base, self.rope_scaling = rope_base, rope.scaling
