"""The models a comparison trains, between GPT-2 and Llama: their shape (``ModelShape``) and switches (``Rung``) as
data (the ladder one change at a time, ``LADDER``; Llama with one change left out, ``ABLATIONS``; the Llama-style
model with its attention swapped, ``ATTENTIONS``, which fix their own K/V head counts), and each built at one shape
with its FFN sized so that the model has GPT-2's parameter count (within 2%): d_ff is the multiple of 8 whose total
is closest to GPT2LM's (the total is linear in d_ff), so what a change saves goes back into its FFN."""

import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

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
from ..validate import positive_int, positive_ints


@dataclass(frozen=True)
class ModelShape:
    """The sizes shared by every model of one comparison."""

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


@dataclass(frozen=True)
class Rung:
    """The switches of one model between GPT-2 and Llama."""

    name: str
    norm: str = "layernorm"  # or "rmsnorm"
    ffn: str = "gelu"  # or "swiglu"
    positions: str = "learned"  # or "rope"
    attention: str = "gpt2"  # GPT-2's fused, biased q/k/v (MHA), "llama": GQAttention (bias-free wq, wk, wv),
    # or "mla": multi-head latent attention with decoupled RoPE (per head: d_h no-RoPE, d_h/2 RoPE, d_h value dims)
    gqa: bool = False  # n_kv_heads < n_heads (Llama attention only)
    n_kv_heads: int | None = None  # with gqa: this many K/V heads instead of the shape's
    kv_latent: int | None = None  # MLA's cached latent size d_c (attention="mla" only)
    qk_norm: bool = False  # (Llama attention only)
    tie: bool = True
    bias: bool = True  # GPT-2's parts (LayerNorm, GELU MLP, GPT-2 attention) keep their biases; Llama's have none
    post_norm: bool = False  # Llama's block with the norm after each residual sum (Llama attention only)
    change: str = ""  # what this model changes, in words

    def __post_init__(self):
        for name, allowed in (("norm", ("layernorm", "rmsnorm")), ("ffn", ("gelu", "swiglu")),
                              ("positions", ("learned", "rope")), ("attention", ("gpt2", "llama", "mla"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        if self.attention != "llama" and (self.gqa or self.qk_norm):
            raise ValueError("gqa and qk_norm need attention='llama' (GQAttention)")
        if self.post_norm and self.attention != "llama":
            raise ValueError("post_norm needs attention='llama' (Llama's block)")
        if self.attention == "gpt2" and self.positions == "rope":
            raise ValueError("positions='rope' needs attention='llama' or 'mla'")
        if self.n_kv_heads is not None:
            positive_int("n_kv_heads", self.n_kv_heads)
            if not self.gqa:
                raise ValueError("n_kv_heads needs gqa=True (without it every query head has its own K/V head)")
        if (self.attention == "mla") != (self.kv_latent is not None):
            raise ValueError("attention='mla' and kv_latent (its latent size) go together")
        if self.kv_latent is not None:
            positive_int("kv_latent", self.kv_latent)
            if self.positions != "rope":
                raise ValueError("attention='mla' needs positions='rope' (its decoupled RoPE key)")

    @property
    def switches(self) -> tuple:
        """What makes the model: every field but the name and the description. Two names can make one model
        (the ladder's ``gqa`` is Llama without QK-norm, ``no_qk_norm``)."""
        return tuple(getattr(self, f.name) for f in fields(self) if f.name not in ("name", "change"))

    def differences(self, other: "Rung") -> list[str]:
        """The switches in which two models differ."""
        return [f.name for f in fields(self) if f.name not in ("name", "change")
                and getattr(self, f.name) != getattr(other, f.name)]


_LLAMA: dict[str, Any] = dict(norm="rmsnorm", ffn="swiglu", positions="rope", attention="llama", gqa=True,
                              qk_norm=True, tie=False)
LADDER: tuple[Rung, ...] = (
    Rung("gpt2", change="GPT-2 baseline (tied head)"),
    Rung("gpt2_untied", tie=False, change="tied -> untied output head"),
    Rung("rmsnorm", norm="rmsnorm", tie=False, change="LayerNorm -> RMSNorm"),
    Rung("swiglu", norm="rmsnorm", ffn="swiglu", tie=False, change="GELU MLP -> SwiGLU (matched params)"),
    Rung("bias_free", **(_LLAMA | dict(positions="learned", gqa=False, qk_norm=False)),
         change="attention biases removed"),
    Rung("rope", **(_LLAMA | dict(gqa=False, qk_norm=False)), change="learned positions -> RoPE"),
    Rung("gqa", **(_LLAMA | dict(qk_norm=False)), change="MHA -> GQA"),
    Rung("llama", **_LLAMA, change="+ QK-norm (= LlamaStyleLM)"),
)
ABLATIONS: tuple[Rung, ...] = (  # leave one out from the Llama end
    Rung("no_rmsnorm", **(_LLAMA | dict(norm="layernorm")), change="RMSNorm -> LayerNorm"),
    Rung("no_swiglu", **(_LLAMA | dict(ffn="gelu")), change="SwiGLU -> GELU MLP"),
    Rung("no_rope", **(_LLAMA | dict(positions="learned")), change="RoPE -> learned positions"),
    Rung("no_qk_norm", **(_LLAMA | dict(qk_norm=False)), change="QK-norm removed"),
    Rung("no_gqa", **(_LLAMA | dict(gqa=False)), change="GQA -> MHA"),
    Rung("llama_tied", **(_LLAMA | dict(tie=True)), change="untied -> tied output head"),
)
OTHERS: tuple[Rung, ...] = (
    Rung("gpt2_nobias", bias=False, change="GPT-2 without biases (nanoGPT's bias=False), tied head"),
    Rung("post_norm", **(_LLAMA | dict(post_norm=True)), change="pre-norm -> post-norm"),
)
MODELS: tuple[Rung, ...] = LADDER + ABLATIONS + OTHERS  # the models every shape builds
MODEL_NAMES = tuple(r.name for r in MODELS)
_ARM: dict[str, Any] = _LLAMA | dict(gqa=False, qk_norm=False)  # Llama-style, MHA, no QK-norm (MLA has none)
ATTENTIONS: tuple[Rung, ...] = (  # need n_heads divisible by 4; MLA's two latents cache as much as GQA-2 and MQA
    Rung("mha", **_ARM, change="multi-head attention: a K/V head per query head"),
    Rung("gqa4", **(_ARM | dict(gqa=True, n_kv_heads=4)), change="grouped-query attention, 4 K/V heads"),
    Rung("gqa2", **(_ARM | dict(gqa=True, n_kv_heads=2)), change="grouped-query attention, 2 K/V heads"),
    Rung("mqa", **(_ARM | dict(gqa=True, n_kv_heads=1)), change="multi-query attention: one K/V head"),
    Rung("mla56", **(_ARM | dict(attention="mla", kv_latent=56)),
         change="multi-head latent attention, latent 56 (+ a RoPE key of d_h/2: GQA-2's cache at d_h 16)"),
    Rung("mla24", **(_ARM | dict(attention="mla", kv_latent=24)),
         change="multi-head latent attention, latent 24 (+ a RoPE key of d_h/2: MQA's cache at d_h 16)"),
    Rung("mha_qk_norm", **(_ARM | dict(qk_norm=True)), change="MHA with QK-norm"),
)
ATTENTION_NAMES = tuple(r.name for r in ATTENTIONS)
ARCH_NAMES = MODEL_NAMES + ATTENTION_NAMES  # every model ``train`` accepts as arch="ladder:<name>"
LADDER_NAMES = tuple(r.name for r in LADDER)
ABLATION_NAMES = tuple(r.name for r in ABLATIONS)
LLAMA_END = "llama"  # the ladder's top and the leave-one-out reference: LlamaStyleLM


def get_rung(name: str) -> Rung:
    for rung in MODELS + ATTENTIONS:
        if rung.name == name:
            return rung
    raise ValueError(f"rung must be one of {list(ARCH_NAMES)}, got {name!r}")


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
