"""The models between GPT-2 and Llama (``training.rungs``) built at one shape, each FFN sized so that the model
has GPT-2's parameter count (within 2%): d_ff is the multiple of 8 whose total is closest to GPT2LM's (the total
is linear in d_ff), so what a change saves goes back into its FFN and what it adds comes out of it."""

import functools
from collections.abc import Callable

import torch
import torch.nn as nn

from ..decoder import DecoderLM
from ..ffn import SwiGLU
from ..gpt2 import GPT2LM, GeluMLP, GPT2Block
from ..kv_cache import kv_cache_bytes_per_token, mla_cache_bytes_per_token
from ..llama import Block, LlamaStyleLM
from ..mla import MLAConfig
from ..params import count_parameters
from ..rmsnorm import RMSNorm
from ..rope import RotaryEmbedding
from ..validate import positive_ints
from .rungs import ARCH_NAMES, LADDER, LLAMA_END, MODEL_NAMES, ModelShape, Rung, get_rung

FFN_MULTIPLE = 8  # FFN hidden sizes are rounded to a multiple of this
GPT2_NORM_EPS, LLAMA_NORM_EPS = 1e-5, 1e-6


class PostNormBlock(Block):
    """Llama's block with the 2017 Transformer's post-norm: x = norm(x + attn(x)), then x = norm(x + ffn(x)).
    The residual stream itself is normalised after every sub-layer, so no path from the loss to the embedding
    skips the norms: the ``post_norm`` model, the side result on why pre-norm trains at higher rates."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        x = self.attn_norm(x + self.drop(self.attn(x, cos, sin, cache)))  # x: [B, T, d]
        return self.ffn_norm(x + self.drop(self.ffn(x)))


class NoRotation(nn.Module):
    """The ``no_rope`` model's RoPE slot: cos = 1 and sin = 0 at every position, so Llama's attention rotates q
    and k by angle 0 and the learned position table alone says where a token is."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # positions: [T] or [B, T]
        shape = (*positions.shape, self.dim // 2)
        return torch.ones(shape, device=positions.device), torch.zeros(shape, device=positions.device)


def ladder_lm(rung: Rung | str, V: int, d: int, n_layers: int, n_heads: int, n_kv_heads: int, d_ff: int,
              max_len: int, dropout: float = 0.0, rope_base: float = 10000.0) -> DecoderLM:
    """The rung's model: the decoder skeleton with the norm, FFN, attention and positions the rung names."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    positive_ints(V=V, d=d, n_layers=n_layers, n_heads=n_heads, max_len=max_len)

    def norm(dim: int) -> nn.Module:  # GPT-2's LayerNorm (with bias unless bias=False) or Llama's RMSNorm
        if rung.norm == "layernorm":
            return nn.LayerNorm(dim, eps=GPT2_NORM_EPS, bias=rung.bias)
        return RMSNorm(dim, LLAMA_NORM_EPS)

    ffn: Callable[..., nn.Module] = functools.partial(GeluMLP, bias=rung.bias) if rung.ffn == "gelu" else SwiGLU
    blocks: list[nn.Module]
    if rung.attention == "gpt2":  # GPT-2's block: its fused q/k/v (biased unless bias=False); learned positions
        blocks = [GPT2Block(d, n_heads, d_ff, bias=rung.bias, dropout=dropout, norm=norm, mlp=ffn)
                  for _ in range(n_layers)]
        rope = None
    else:  # Llama's block: GQAttention, which rotates q and k (by angle 0 without RoPE), or MLA
        kv = (rung.n_kv_heads or n_kv_heads) if rung.gqa else n_heads
        mla = mla_config(rung, d, n_heads)
        block = PostNormBlock if rung.post_norm else Block
        blocks = [block(d, n_heads, kv, d_ff, qk_norm=rung.qk_norm, norm_eps=LLAMA_NORM_EPS, dropout=dropout,
                        norm=norm, ffn=ffn, mla=mla) for _ in range(n_layers)]
        dh = mla.rope_dim if mla else d // n_heads  # the rotated part of a head
        rope = RotaryEmbedding(dh, max_len, rope_base) if rung.positions == "rope" else NoRotation(dh)
    return DecoderLM(nn.Embedding(V, d), blocks, norm(d), max_len=max_len, tie=rung.tie, dropout=dropout,
                     wpe=nn.Embedding(max_len, d) if rung.positions == "learned" else None, rope=rope)


def mla_config(rung: Rung, d: int, n_heads: int) -> MLAConfig | None:
    """The MLA sizes of an ``attention="mla"`` rung (None for the others): DeepSeek-V2's proportions at head
    size d_h = d / n_heads, a no-RoPE and a value part of d_h and a shared RoPE key of d_h / 2, no query latent."""
    if rung.attention != "mla":
        return None
    dh = d // n_heads
    return MLAConfig(kv_latent_dim=rung.kv_latent or 0, rope_dim=dh // 2, nope_dim=dh, v_head_dim=dh,
                     norm_eps=LLAMA_NORM_EPS)


def cache_bytes_per_token(rung: Rung | str, shape: ModelShape, bytes_per_elem: int = 2) -> int:
    """Bytes one token adds to the rung's inference cache over all layers (bf16 by default): K and V of its
    K/V heads, or MLA's latent and RoPE key."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    mla = mla_config(rung, shape.d, shape.n_heads)
    if mla is not None:
        return mla_cache_bytes_per_token(shape.n_layers, mla.kv_latent_dim, mla.rope_dim, bytes_per_elem)
    kv = (rung.n_kv_heads or shape.n_kv_heads) if rung.gqa else shape.n_heads
    return kv_cache_bytes_per_token(shape.n_layers, kv, shape.d // shape.n_heads, bytes_per_elem)


def _count_on_meta(build) -> int:
    """Parameters of the model ``build()`` makes, without allocating or initialising them."""
    with torch.device("meta"):
        return count_parameters(build())


@functools.lru_cache(maxsize=64)
def gpt2_parameters(shape: ModelShape, V: int) -> int:
    """The budget: parameters of GPT2LM (d_ff = 4d, tied head) at this shape."""
    return _count_on_meta(lambda: GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size))


def matched_d_ff(rung: Rung | str, shape: ModelShape, V: int, multiple_of: int = FFN_MULTIPLE) -> int:
    """FFN hidden size giving the model the total closest to GPT-2's; 4d for GPT-2 itself and for nanoGPT's
    bias-free GPT-2 (``gpt2_nobias``: 0.3% below the budget at the laptop scale)."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    if rung == LADDER[0] or rung.name == "gpt2_nobias":
        return 4 * shape.d
    target = gpt2_parameters(shape, V)
    at_one_step = _count_on_meta(lambda: _ladder(rung, shape, V, multiple_of))
    per_unit = (_count_on_meta(lambda: _ladder(rung, shape, V, 2 * multiple_of)) - at_one_step) // multiple_of
    without_ffn = at_one_step - per_unit * multiple_of  # parameters per unit of d_ff: 3·d·L or (2·d + 1)·L
    d_ff = max(multiple_of, multiple_of * round((target - without_ffn) / (per_unit * multiple_of)))
    if abs(without_ffn + per_unit * d_ff - target) > 0.01 * target:  # tiny models: the multiple is too coarse
        d_ff = max(1, round((target - without_ffn) / per_unit))
    return d_ff


def _ladder(rung: Rung, shape: ModelShape, V: int, d_ff: int) -> DecoderLM:
    return ladder_lm(rung, V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads, d_ff, shape.block_size,
                     shape.dropout)


def ladder_model(rung: Rung | str, shape: ModelShape, V: int) -> DecoderLM:
    """The rung's model at this shape, its FFN sized to match GPT-2's parameters."""
    rung = get_rung(rung) if isinstance(rung, str) else rung
    return _ladder(rung, shape, V, matched_d_ff(rung, shape, V))


def build_model(arch: str, shape: ModelShape, V: int) -> nn.Module:
    """``"gpt2"`` -> GPT2LM, ``"llama"`` -> LlamaStyleLM (GQA, QK-norm, untied, matched d_ff), or
    ``"ladder:<rung>"`` -> that model (``ladder_lm``). Same shape, parameters matched to GPT-2's."""
    if arch == "gpt2":
        return GPT2LM(V, shape.d, shape.n_layers, shape.n_heads, shape.block_size, dropout=shape.dropout)
    if arch == "llama":
        return LlamaStyleLM(V, shape.d, shape.n_layers, shape.n_heads, shape.n_kv_heads,
                            matched_d_ff(LLAMA_END, shape, V), shape.block_size, tie=False, qk_norm=True,
                            dropout=shape.dropout)
    if arch.startswith("ladder:"):
        return ladder_model(arch.split(":", 1)[1], shape, V)
    raise ValueError(f"arch must be 'gpt2', 'llama' or 'ladder:<rung>' with a rung in {list(ARCH_NAMES)}, "
                     f"got {arch!r}")


def size_table(shape: ModelShape, V: int, rungs=MODEL_NAMES) -> list[dict]:
    """Each model's d_ff, parameters and ratio to GPT-2's: the evidence that the sizes match."""
    target = gpt2_parameters(shape, V)
    rows = []
    for rung in map(get_rung, rungs):
        d_ff = matched_d_ff(rung, shape, V)
        n = _count_on_meta(lambda rung=rung, d_ff=d_ff: _ladder(rung, shape, V, d_ff))
        rows.append({"rung": rung.name, "change": rung.change, "d_ff": d_ff, "params": n, "ratio": n / target})
    return rows
