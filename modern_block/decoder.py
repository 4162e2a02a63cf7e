"""The decoder every language model of the course is: one skeleton, filled with each model's parts.

    idx ─► embedding ─(+ learned position vectors)─► block ─► … ─► block ─► final norm ─► head ─► logits
                        (or: each block's attention rotates q and k by RoPE's tables)

A block is a pre-norm residual block, x + attention(norm(x)), then x + FFN(norm(x)); blocks differ only in their
parts. GPT-2 (``gpt2.GPT2LM``, lesson 00) fills the skeleton with a learned position table, LayerNorm, multi-head
attention and a GELU MLP; the Llama-style LM (``llama.LlamaStyleLM``, lesson 07) with RoPE, RMSNorm, grouped-query
attention and SwiGLU; the models between the two (lesson 08's ladder) with a mix.
"""

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from .params import count_parameters
from .validate import check_positions, dropout_rate, positive_int, token_ids


class DecoderLM(nn.Module):
    """A decoder-only language model assembled from its parts; ``forward(idx)`` returns logits [B, T, V].

    ``emb``: the token embedding, ``nn.Embedding(V, d)``; ``blocks``: the residual blocks; ``norm``: the final
    norm. Positions enter in one of two ways: ``wpe``, a learned table ``nn.Embedding(max_len, d)`` whose rows are
    added to the token embeddings (GPT-2), or ``rope``, a module that returns the (cos, sin) tables of the
    positions (``rope.RotaryEmbedding``), which every block hands to its attention to rotate q and k (Llama).
    The head maps back to V logits; with ``tie=True`` it is the embedding matrix itself. The weights start as
    GPT-2's (``init_gpt2_style``, below), each block naming the linears that write into the residual stream.
    """

    def __init__(self, emb: nn.Embedding, blocks: Sequence[nn.Module], norm: nn.Module, *, max_len: int,
                 wpe: nn.Embedding | None = None, rope: nn.Module | None = None, tie: bool = False,
                 dropout: float = 0.0):
        super().__init__()
        positive_int("max_len", max_len)
        dropout_rate(dropout)
        self.V, self.max_len = emb.num_embeddings, max_len
        self.emb = emb
        self.wpe = wpe
        self.rope = rope
        self.drop = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.blocks = nn.ModuleList(blocks)
        self.norm = norm
        self.head = nn.Linear(emb.embedding_dim, self.V, bias=False)
        init_gpt2_style(self)
        if tie:
            self.head.weight = self.emb.weight  # one matrix, two uses

    @property
    def tied(self) -> bool:
        return self.head.weight is self.emb.weight

    def forward(self, idx: torch.Tensor, cache=None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, T, V] for idx [B, T]. With a ``cache`` (a ``kv_cache.KVCache``), idx continues the sequences
        it holds. ``positions`` ([T] or [B, T]) overrides the default positions start .. start + T - 1."""
        start = 0 if cache is None else cache.length  # tokens already held
        token_ids(idx, self.V, self.max_len, offset=start, cache=cache, n_layers=len(self.blocks))
        if positions is None:
            positions = start + torch.arange(idx.shape[1], device=idx.device)  # [T]
        else:
            check_positions(positions, idx, self.max_len)
        x = self.emb(idx)  # [B, T, d]
        if self.wpe is not None:
            x = x + self.wpe(positions)  # + [T, d] (or [B, T, d]): a learned vector per position
        rotation = () if self.rope is None else self.rope(positions)  # (cos, sin), [T, d_rope/2] each
        x = self.drop(x)
        for i, block in enumerate(self.blocks):  # a block takes x and, with RoPE, the two tables
            x = block(x, *rotation, cache=None if cache is None else cache[i])
        return self.head(self.norm(x))  # [B, T, V]

    def num_parameters(self) -> int:
        return count_parameters(self)


def init_gpt2_style(model: DecoderLM, std: float = 0.02) -> None:
    """GPT-2's initialisation of a ``decoder.DecoderLM``: Normal(0, 0.02) weights for every linear layer and
    embedding, zero biases (norm scales keep their ones). The linears that write into the residual stream,
    which each block names in ``residual_projections()``, get std 0.02/sqrt(2·n_layers): every layer adds
    two such outputs to the stream, and the smaller std keeps the stream's variance from growing with depth.

    The draws follow ``model.modules()`` (the order the parts were registered in), so a model built from the
    same parts in the same order gets the same weights from the same seed."""
    blocks: list = list(model.blocks)  # each family's blocks: each names its residual projections
    n_layers = len(blocks)
    residual = [linear for block in blocks for linear in block.residual_projections()]
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, std / math.sqrt(2 * n_layers) if module in residual else std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
