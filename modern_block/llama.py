"""The modern block and the Llama-style language model built from it.

    x ─► RMSNorm ─► attention (GQA, RoPE, optional QK-norm) ─► + ─► RMSNorm ─► SwiGLU ─► + ─►

Pre-norm residuals, no biases, no position embedding (RoPE rotates q and k inside attention),
and an output head that may share the embedding matrix (``tie=True``). With ``mla=MLAConfig(...)``
the attention is DeepSeek's multi-head latent attention (lesson 05) instead of GQA.
"""

import torch
import torch.nn as nn

from .attention import GQAttention
from .ffn import SwiGLU
from .mla import MLAConfig
from .params import count_parameters, init_gpt2_style
from .rmsnorm import RMSNorm
from .rope import check_rope_scaling, rope_cache
from .validate import check_positions, positive_int, token_ids


class Block(nn.Module):
    """x + attn(RMSNorm(x)), then x + SwiGLU(RMSNorm(x))."""

    def __init__(self, d: int, n_heads: int, n_kv_heads: int, d_ff: int, *, qk_norm: bool = True,
                 norm_eps: float = 1e-6, head_dim: int | None = None, dropout: float = 0.0,
                 mla: MLAConfig | None = None, qkv_bias: bool = False):
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(d, norm_eps), RMSNorm(d, norm_eps)
        if mla is None:
            self.attn = GQAttention(d, n_heads, n_kv_heads, qk_norm, head_dim=head_dim, norm_eps=norm_eps,
                                    dropout=dropout, qkv_bias=qkv_bias)
        else:
            self.attn = mla.build(d, n_heads, dropout)
        self.ffn = SwiGLU(d, d_ff)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x: [B, T, d]; cos, sin: the RoPE tables of these positions; cache: this layer's ``LayerCache`` or None."""
        x = x + self.drop(self.attn(self.attn_norm(x), cos, sin, cache))
        return x + self.drop(self.ffn(self.ffn_norm(x)))


class LlamaStyleLM(nn.Module):
    """Llama/Qwen-style decoder; ``forward(idx)`` returns logits [B, T, V].

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
        super().__init__()
        for name, value in (("V", V), ("d", d), ("n_layers", n_layers), ("max_len", max_len)):
            positive_int(name, value)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if mla is not None and not isinstance(mla, MLAConfig):
            raise TypeError(f"mla must be an MLAConfig, got {type(mla).__name__}")
        self.V, self.max_len, self.rope_base = V, max_len, rope_base
        self.rope_scaling = check_rope_scaling(rope_scaling)
        self.emb = nn.Embedding(V, d)
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(
            Block(d, n_heads, n_kv_heads, d_ff, qk_norm=qk_norm, norm_eps=norm_eps, head_dim=head_dim,
                  dropout=dropout, mla=mla, qkv_bias=qkv_bias)
            for _ in range(n_layers))
        self.norm = RMSNorm(d, norm_eps)
        self.head = nn.Linear(d, V, bias=False)
        init_gpt2_style(self, n_layers)
        if tie:
            self.head.weight = self.emb.weight  # tied embeddings: one matrix, two uses
        # one RoPE table for all layers and positions, sized for the rotated part of each head
        cos, sin = rope_cache(max_len, self.blocks[0].attn.rope_dim, rope_base,
                              scaling=self.rope_scaling)  # [max_len, rope_dim/2]
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    @property
    def tied(self) -> bool:
        return self.head.weight is self.emb.weight

    def forward(self, idx: torch.Tensor, cache=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] for idx [B, T]. With a ``cache`` (a ``kv_cache.KVCache``), idx continues the
        sequences it holds. ``positions`` ([T] or [B, T]) overrides the default positions start .. start + T - 1."""
        start = 0 if cache is None else cache.length
        token_ids(idx, self.V, self.max_len, offset=start, cache=cache, n_layers=len(self.blocks))
        T = idx.shape[1]
        if positions is not None:
            check_positions(positions, idx, self.max_len)
        table_cos, table_sin = self.cos, self.sin
        if self.rope_scaling is not None and self.rope_scaling["rope_type"] == "dynamic":
            # dynamic NTK: the frequencies depend on the length seen so far (Hugging Face's rule)
            end = start + T if positions is None else int(positions.max()) + 1
            table_cos, table_sin = rope_cache(end, self.cos.shape[1] * 2, self.rope_base, self.cos.device,
                                              scaling=self.rope_scaling)  # [end, rope_dim/2]
        if positions is None:
            cos, sin = table_cos[start:start + T], table_sin[start:start + T]  # [T, rope_dim/2]
        else:
            cos, sin = table_cos[positions], table_sin[positions]  # [T or B×T, rope_dim/2]
        x = self.drop(self.emb(idx))  # [B, T, d]; no position embedding: RoPE does it
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, None if cache is None else cache[i])
        return self.head(self.norm(x))  # [B, T, V]

    def num_parameters(self) -> int:
        return count_parameters(self)

