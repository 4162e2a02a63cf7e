"""From GPT-2 to Llama one change at a time, and back one change at a time, at a matched number of parameters.

``LadderLM`` is one configurable decoder assembled from the package's own components, so that
every intermediate model exists (a GPT-2 with RMSNorm, a Llama with MHA, ...).

The rungs (the ladder, cumulative, GPT-2 -> Llama, and the leave-one-out models from the Llama end) and
the shape they share are data in ``training.rungs``; this module builds them.

Llama's components carry no biases, so each rung of the ladder also drops the biases of the part
it replaces (and a leave-one-out model gets GPT-2's part back with them). ``gpt2``, ``untied``,
``qk_norm`` and ``tied`` are exactly ``GPT2LM`` and ``LlamaStyleLM`` with a tied or an untied head:
same parameters, registered in the same order (a state dict copies across and gives the same
logits; the tests check this).

Matching sizes. ``GPT2LM`` (d_ff = 4d, tied head) sets the budget, P_gpt2 parameters, for every
model here. Every other model gets the FFN hidden size that brings its total closest to P_gpt2:
the total is linear in d_ff (a SwiGLU holds 3·d weights per unit of d_ff and layer, a GELU MLP
2·d + 1 with its bias), so

    d_ff = round_to_multiple( (P_gpt2 - P_without_ffn) / (per_unit · n_layers), 8 )

With MHA and SwiGLU this is the 8/3·d rule (3·d·d_ff = 8·d²), corrected for the dropped biases and
position table; whatever a model saves (GQA's smaller K/V, RMSNorm's missing bias) goes back into
its FFN, and whatever it adds (an untied head, V·d; a position table) comes out of it. Rounding to
a multiple of 8 moves the total by at most 12·d·n_layers parameters (0.13% at the GPU scale), well
inside the 2% the comparison allows; in models so small that this step is over 1% of the total, d_ff
is rounded to the nearest integer instead.
"""

import functools

import torch
import torch.nn as nn

from ..attention import GQAttention
from ..ffn import SwiGLU
from ..gpt2 import GPT2LM, CausalSelfAttention, GeluMLP
from ..llama import LlamaStyleLM
from ..params import count_parameters, init_gpt2_style
from ..rmsnorm import RMSNorm
from ..rope import rope_cache
from ..validate import positive_int, token_ids
from .rungs import LADDER, LLAMA_END, RUNG_NAMES, ModelShape, Rung, get_rung

FFN_MULTIPLE = 8  # FFN hidden sizes are rounded to a multiple of this
GPT2_NORM_EPS, LLAMA_NORM_EPS = 1e-5, 1e-6


class LadderBlock(nn.Module):
    """Pre-norm residual block whose norm, attention and FFN are chosen by a ``Rung``."""

    def __init__(self, rung: Rung, d: int, n_heads: int, n_kv_heads: int, d_ff: int, dropout: float):
        super().__init__()
        self.norm1, self.norm2 = _norm(rung, d), _norm(rung, d)
        if rung.attention == "gpt2":
            self.attn = CausalSelfAttention(d, n_heads, bias=True, dropout=dropout)
        else:
            kv = n_kv_heads if rung.gqa else n_heads
            self.attn = GQAttention(d, n_heads, kv, rung.qk_norm, norm_eps=LLAMA_NORM_EPS, dropout=dropout)
        self.ffn = GeluMLP(d, d_ff, bias=True) if rung.ffn == "gelu" else SwiGLU(d, d_ff)
        self.drop = nn.Dropout(dropout)
        self.llama_attention = rung.attention == "llama"

    def forward(self, x, cos=None, sin=None, cache=None):  # x: [B, T, d]
        h = self.norm1(x)
        h = self.attn(h, cos, sin, cache) if self.llama_attention else self.attn(h, cache)
        x = x + self.drop(h)
        return x + self.drop(self.ffn(self.norm2(x)))


def _norm(rung: Rung, d: int) -> nn.Module:
    """GPT-2's LayerNorm (with bias) or Llama's RMSNorm."""
    return nn.LayerNorm(d, eps=GPT2_NORM_EPS) if rung.norm == "layernorm" else RMSNorm(d, LLAMA_NORM_EPS)


class LadderLM(nn.Module):
    """A decoder between GPT-2 and Llama; ``forward(idx)`` returns logits [B, T, V]."""

    def __init__(self, rung: Rung | str, V: int, d: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 d_ff: int, max_len: int, dropout: float = 0.0, rope_base: float = 10000.0):
        super().__init__()
        rung = get_rung(rung) if isinstance(rung, str) else rung
        for name, value in (("V", V), ("d", d), ("n_layers", n_layers), ("max_len", max_len)):
            positive_int(name, value)
        self.rung, self.V, self.max_len = rung, V, max_len
        self.emb = nn.Embedding(V, d)
        self.pos = nn.Embedding(max_len, d) if rung.positions == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(LadderBlock(rung, d, n_heads, n_kv_heads, d_ff, dropout)
                                    for _ in range(n_layers))
        self.norm = _norm(rung, d)
        self.head = nn.Linear(d, V, bias=False)
        init_gpt2_style(self, n_layers)  # same draws, in the same order, as GPT2LM and LlamaStyleLM
        if rung.tie:
            self.head.weight = self.emb.weight
        if rung.attention == "llama":  # GQAttention rotates q and k by these tables
            cos, sin = rope_cache(max_len, d // n_heads, rope_base)  # [max_len, dh/2]
            if rung.positions == "learned":  # no RoPE: a rotation by angle 0 leaves q and k as they are
                cos, sin = torch.ones_like(cos), torch.zeros_like(sin)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:  # idx: [B, T]
        start = cache.length if cache is not None else 0
        token_ids(idx, self.V, self.max_len, offset=start, cache=cache, n_layers=len(self.blocks))
        T = idx.shape[1]
        x = self.emb(idx)  # [B, T, d]
        if self.pos is not None:
            x = x + self.pos(torch.arange(start, start + T, device=idx.device))  # + [T, d]
        cos = sin = None
        if self.rung.attention == "llama":
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # [T, dh/2]
        x = self.drop(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, cache[i] if cache is not None else None)
        return self.head(self.norm(x))  # [B, T, V]

    def num_parameters(self) -> int:
        return count_parameters(self)


def _count_on_meta(build) -> int:
    """Parameters of the model ``build()`` makes, without allocating or initialising them."""
    with torch.device("meta"):
        return count_parameters(build())


@functools.lru_cache(maxsize=64)
def gpt2_parameters(shape: ModelShape, V: int) -> int:
    """The budget: parameters of GPT2LM (d_ff = 4d, tied head) at this shape."""
    return _count_on_meta(lambda: GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size))


def matched_d_ff(rung: Rung | str, shape: ModelShape, V: int, multiple_of: int = FFN_MULTIPLE) -> int:
    """FFN hidden size giving the model the total closest to GPT-2's (see the module docstring);
    4d for the GPT-2 baseline itself, which sets the budget."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    if rung == LADDER[0]:
        return 4 * shape.d
    target = gpt2_parameters(shape, V)
    at_one_step = _count_on_meta(lambda: _ladder(rung, shape, V, multiple_of))
    per_unit = (_count_on_meta(lambda: _ladder(rung, shape, V, 2 * multiple_of)) - at_one_step) // multiple_of
    without_ffn = at_one_step - per_unit * multiple_of  # parameters per unit of d_ff: 3·d·L or (2·d + 1)·L
    d_ff = max(multiple_of, multiple_of * round((target - without_ffn) / (per_unit * multiple_of)))
    if abs(without_ffn + per_unit * d_ff - target) > 0.01 * target:  # tiny models: the multiple is too coarse
        d_ff = max(1, round((target - without_ffn) / per_unit))
    return d_ff


def _ladder(rung: Rung, shape: ModelShape, V: int, d_ff: int) -> LadderLM:
    return LadderLM(rung, V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads, d_ff, shape.block_size,
                    shape.dropout)


def ladder_model(rung: Rung | str, shape: ModelShape, V: int) -> LadderLM:
    """The rung's model at this shape, its FFN sized to match GPT-2's parameters."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    return _ladder(rung, shape, V, matched_d_ff(rung, shape, V))


def build_model(arch: str, shape: ModelShape, V: int) -> nn.Module:
    """``"gpt2"`` -> GPT2LM, ``"llama"`` -> LlamaStyleLM (GQA, QK-norm, untied, matched d_ff), or
    ``"ladder:<rung>"`` -> that model as a LadderLM. Same shape, parameters matched to GPT-2's."""
    if arch == "gpt2":
        return GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size, dropout=shape.dropout)
    if arch == "llama":
        return LlamaStyleLM(V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads,
                            matched_d_ff(LLAMA_END, shape, V), shape.block_size, tie=False, qk_norm=True,
                            dropout=shape.dropout)
    if arch.startswith("ladder:"):
        return ladder_model(arch.split(":", 1)[1], shape, V)
    raise ValueError(f"arch must be 'gpt2', 'llama' or 'ladder:<rung>' with a rung in {list(RUNG_NAMES)}, "
                     f"got {arch!r}")


def size_table(shape: ModelShape, V: int, rungs=RUNG_NAMES) -> list[dict]:
    """Each model's d_ff, parameters and ratio to GPT-2's: the evidence that the sizes match."""
    target = gpt2_parameters(shape, V)
    rows = []
    for rung in map(get_rung, rungs):
        d_ff = matched_d_ff(rung, shape, V)
        n = _count_on_meta(lambda rung=rung, d_ff=d_ff: _ladder(rung, shape, V, d_ff))
        rows.append({"rung": rung.name, "change": rung.change, "d_ff": d_ff, "params": n, "ratio": n / target})
    return rows
