"""From GPT-2 to Llama one change at a time, at a matched number of parameters.

``LadderLM`` is one configurable decoder assembled from the package's own components, so that
every intermediate model exists (a GPT-2 with RMSNorm, a Llama with MHA, ...):

    rung      what changes (cumulative)                          components
    gpt2      the baseline: LayerNorm, GELU MLP (4d), learned    nn.LayerNorm, GeluMLP,
              positions, MHA with biases, tied head              CausalSelfAttention
    rmsnorm   LayerNorm -> RMSNorm                               RMSNorm
    swiglu    GELU MLP -> SwiGLU at matched parameters           SwiGLU
    rope      learned positions -> RoPE                          GQAttention (n_kv = h), rope_cache
    gqa       MHA -> GQA (n_kv_heads < n_heads)                  GQAttention
    qk_norm   + RMSNorm on each head's q and k                   GQAttention(qk_norm=True)
    untied    separate output head = LlamaStyleLM                nn.Linear

Llama's components carry no biases, so each rung also drops the biases of the part it replaces.
The two ends are exactly ``GPT2LM`` and ``LlamaStyleLM``: same parameters, registered in the same
order (a state dict copies across and gives the same logits; the tests check this).

Matching sizes. The GPT-2 arm sets the budget: P_gpt2 parameters with d_ff = 4d. Every model with
a SwiGLU FFN gets the hidden size that brings its total closest to P_gpt2: the total is linear in
d_ff (each layer's SwiGLU holds 3·d·d_ff weights), so

    d_ff = round_to_multiple( (P_gpt2 - P_without_ffn) / (3·d·n_layers), 8 )

With MHA this is the 8/3·d rule (3·d·d_ff = 8·d²), corrected for the dropped biases and position
table; with GQA the K/V weights it saves go back into the FFN (as Llama 2 70B and Llama 3 widen
theirs). Rounding to a multiple of 8 moves the total by at most 12·d·n_layers parameters (0.13%
at the GPU scale), well inside the 2% the comparison allows; in models so small that this step is
over 1% of the total, d_ff is rounded to the nearest integer instead.
"""

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn

from ._validate import positive_int, token_ids
from .attention import GQAttention
from .ffn import SwiGLU
from .gpt2 import GPT2LM, CausalSelfAttention, GeluMLP
from .llama import LlamaStyleLM
from .params import count_parameters, init_gpt2_style
from .rmsnorm import RMSNorm
from .rope import rope_cache

FFN_MULTIPLE = 8  # SwiGLU hidden sizes are rounded to a multiple of this
GPT2_NORM_EPS, LLAMA_NORM_EPS = 1e-5, 1e-6


@dataclass(frozen=True)
class Rung:
    """The switches of one ladder model."""

    name: str
    norm: str = "layernorm"  # or "rmsnorm"
    ffn: str = "gelu"  # or "swiglu"
    positions: str = "learned"  # or "rope"
    gqa: bool = False  # n_kv_heads < n_heads (needs positions="rope": GQAttention)
    qk_norm: bool = False
    tie: bool = True
    change: str = ""  # what this rung changes, in words


RUNGS: tuple[Rung, ...] = (
    Rung("gpt2", change="GPT-2 baseline"),
    Rung("rmsnorm", norm="rmsnorm", change="LayerNorm -> RMSNorm"),
    Rung("swiglu", norm="rmsnorm", ffn="swiglu", change="GELU MLP -> SwiGLU (matched params)"),
    Rung("rope", norm="rmsnorm", ffn="swiglu", positions="rope", change="learned positions -> RoPE"),
    Rung("gqa", norm="rmsnorm", ffn="swiglu", positions="rope", gqa=True, change="MHA -> GQA"),
    Rung("qk_norm", norm="rmsnorm", ffn="swiglu", positions="rope", gqa=True, qk_norm=True, change="+ QK-norm"),
    Rung("untied", norm="rmsnorm", ffn="swiglu", positions="rope", gqa=True, qk_norm=True, tie=False,
         change="untied output head (= LlamaStyleLM)"),
)
RUNG_NAMES = tuple(r.name for r in RUNGS)


def get_rung(name: str) -> Rung:
    for rung in RUNGS:
        if rung.name == name:
            return rung
    raise ValueError(f"rung must be one of {list(RUNG_NAMES)}, got {name!r}")


class LadderBlock(nn.Module):
    """Pre-norm residual block whose norm, attention and FFN are chosen by a ``Rung``."""

    def __init__(self, rung: Rung, d: int, n_heads: int, n_kv_heads: int, d_ff: int, dropout: float):
        super().__init__()
        bias = rung.norm == "layernorm"  # GPT-2's LayerNorm has a bias, RMSNorm none
        make_norm = ((lambda: nn.LayerNorm(d, eps=GPT2_NORM_EPS, bias=bias)) if rung.norm == "layernorm"
                     else (lambda: RMSNorm(d, LLAMA_NORM_EPS)))
        self.norm1 = make_norm()
        if rung.positions == "learned":
            self.attn = CausalSelfAttention(d, n_heads, bias=True, dropout=dropout)
        else:
            kv = n_kv_heads if rung.gqa else n_heads
            self.attn = GQAttention(d, n_heads, kv, rung.qk_norm, norm_eps=LLAMA_NORM_EPS, dropout=dropout)
        self.norm2 = make_norm()
        self.ffn = GeluMLP(d, d_ff, bias=True) if rung.ffn == "gelu" else SwiGLU(d, d_ff)
        self.drop = nn.Dropout(dropout)
        self.rope = rung.positions == "rope"

    def forward(self, x, cos=None, sin=None, cache=None):  # x: [B, T, d]
        h = self.norm1(x)
        h = self.attn(h, cos, sin, cache) if self.rope else self.attn(h, cache)
        x = x + self.drop(h)
        return x + self.drop(self.ffn(self.norm2(x)))


class LadderLM(nn.Module):
    """A decoder between GPT-2 and Llama; ``forward(idx)`` returns logits [B, T, V]."""

    def __init__(self, rung: Rung | str, V: int, d: int, n_layers: int, n_heads: int, n_kv_heads: int,
                 d_ff: int, max_len: int, dropout: float = 0.0, rope_base: float = 10000.0):
        super().__init__()
        rung = get_rung(rung) if isinstance(rung, str) else rung
        for name, value in (("V", V), ("d", d), ("n_layers", n_layers), ("max_len", max_len)):
            positive_int(name, value)
        if rung.gqa and rung.positions != "rope":
            raise ValueError("gqa=True needs positions='rope' (GQAttention applies RoPE)")
        self.rung, self.V, self.max_len = rung, V, max_len
        self.emb = nn.Embedding(V, d)
        self.pos = nn.Embedding(max_len, d) if rung.positions == "learned" else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(LadderBlock(rung, d, n_heads, n_kv_heads, d_ff, dropout)
                                    for _ in range(n_layers))
        self.norm = (nn.LayerNorm(d, eps=GPT2_NORM_EPS) if rung.norm == "layernorm" else RMSNorm(d, LLAMA_NORM_EPS))
        self.head = nn.Linear(d, V, bias=False)
        init_gpt2_style(self, n_layers)  # same draws, in the same order, as GPT2LM and LlamaStyleLM
        if rung.tie:
            self.head.weight = self.emb.weight
        if rung.positions == "rope":
            cos, sin = rope_cache(max_len, d // n_heads, rope_base)  # [max_len, dh/2]
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:  # idx: [B, T]
        start = cache.length if cache is not None else 0
        token_ids(idx, self.V, self.max_len, offset=start, cache=cache, n_layers=len(self.blocks))
        T = idx.shape[1]
        x = self.emb(idx)  # [B, T, d]
        cos = sin = None
        if self.pos is not None:
            x = x + self.pos(torch.arange(start, start + T, device=idx.device))  # + [T, d]
        else:
            cos, sin = self.cos[start:start + T], self.sin[start:start + T]  # [T, dh/2]
        x = self.drop(x)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, cache[i] if cache is not None else None)
        return self.head(self.norm(x))  # [B, T, V]

    def num_parameters(self) -> int:
        return count_parameters(self)


@dataclass(frozen=True)
class ModelShape:
    """The sizes shared by both arms and every rung."""

    d: int = 384
    n_layers: int = 6
    n_heads: int = 6
    n_kv_heads: int = 2
    block_size: int = 256
    dropout: float = 0.0

    def __post_init__(self):
        for name in ("d", "n_layers", "n_heads", "n_kv_heads", "block_size"):
            positive_int(name, getattr(self, name))
        if self.d % self.n_heads or self.n_heads % self.n_kv_heads:
            raise ValueError(f"d ({self.d}) must be divisible by n_heads ({self.n_heads}), and n_heads by "
                             f"n_kv_heads ({self.n_kv_heads})")


def _count_on_meta(build) -> int:
    """Parameters of the model ``build()`` makes, without allocating or initialising them."""
    with torch.device("meta"):
        return count_parameters(build())


@functools.lru_cache(maxsize=64)
def gpt2_parameters(shape: ModelShape, V: int) -> int:
    """The budget: parameters of GPT2LM (d_ff = 4d, tied head) at this shape."""
    return _count_on_meta(lambda: GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size))


def matched_d_ff(rung: Rung | str, shape: ModelShape, V: int, multiple_of: int = FFN_MULTIPLE) -> int:
    """SwiGLU hidden size giving the rung the total closest to GPT-2's (see the module docstring)."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    if rung.ffn != "swiglu":
        return 4 * shape.d
    target = gpt2_parameters(shape, V)
    at_one_step = _count_on_meta(lambda: _ladder(rung, shape, V, multiple_of))
    per_unit = 3 * shape.d * shape.n_layers  # parameters per unit of d_ff
    without_ffn = at_one_step - per_unit * multiple_of
    d_ff = max(multiple_of, multiple_of * round((target - without_ffn) / (per_unit * multiple_of)))
    if abs(without_ffn + per_unit * d_ff - target) > 0.01 * target:  # tiny models: the multiple is too coarse
        d_ff = max(1, round((target - without_ffn) / per_unit))
    return d_ff


def _ladder(rung: Rung, shape: ModelShape, V: int, d_ff: int) -> LadderLM:
    return LadderLM(rung, V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads, d_ff, shape.block_size,
                    shape.dropout)


def ladder_model(rung: Rung | str, shape: ModelShape, V: int) -> LadderLM:
    """The rung's model at this shape, its SwiGLU (if any) sized to match GPT-2's parameters."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    return _ladder(rung, shape, V, matched_d_ff(rung, shape, V))


def build_model(arch: str, shape: ModelShape, V: int) -> nn.Module:
    """``"gpt2"`` -> GPT2LM, ``"llama"`` -> LlamaStyleLM (GQA, QK-norm, untied, matched d_ff), or
    ``"ladder:<rung>"`` -> that rung's LadderLM. Same shape, parameters matched to GPT-2's."""
    if arch == "gpt2":
        return GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size, dropout=shape.dropout)
    if arch == "llama":
        return LlamaStyleLM(V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads,
                            matched_d_ff("untied", shape, V), shape.block_size, tie=False, qk_norm=True,
                            dropout=shape.dropout)
    if arch.startswith("ladder:"):
        return ladder_model(arch.split(":", 1)[1], shape, V)
    raise ValueError(f"arch must be 'gpt2', 'llama' or 'ladder:<rung>' with a rung in {list(RUNG_NAMES)}, "
                     f"got {arch!r}")


def size_table(shape: ModelShape, V: int) -> list[dict]:
    """Every rung's d_ff, parameters and ratio to GPT-2's: the evidence that the sizes match."""
    target = gpt2_parameters(shape, V)
    rows = []
    for rung in RUNGS:
        d_ff = matched_d_ff(rung, shape, V)
        n = _count_on_meta(lambda rung=rung, d_ff=d_ff: _ladder(rung, shape, V, d_ff))
        rows.append({"rung": rung.name, "change": rung.change, "d_ff": d_ff, "params": n, "ratio": n / target})
    return rows

