"""The models a comparison trains, as data: their shape (``ModelShape``) and switches (``Rung``): the ladder from
GPT-2 to Llama one change at a time (``LADDER``), Llama with one change left out (``ABLATIONS``), two others, and
the Llama-style model with its attention swapped (``ATTENTIONS``: MHA, GQA, MQA, MLA, QK-norm; they fix their own
K/V head counts, so they need a head count those divide). Settings are checked against this table without
importing a model class."""

from dataclasses import dataclass, fields
from typing import Any

from ..validate import positive_int


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
