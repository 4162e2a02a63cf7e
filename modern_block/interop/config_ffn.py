"""The FFN a config describes (lesson 02): gated or plain, its activation (which makes a gated FFN a SwiGLU, a
GeGLU, ...), and the width's relation to d: a simple ratio, and which sizing rule reproduces it.

A rule is credited to a model only where the model's authors publish it: Meta's ``multiple_of`` and
``ffn_dim_multiplier`` in each Llama's ``params.json`` (``META_RULES``). Elsewhere the card states the ratio and,
when Llama's arithmetic happens to give the same width, says so without calling it that model's rule (Mistral
7B's 14,336 = 3.5·d is Llama 3 8B's number, not Llama 3's rule applied by Mistral).
"""

from ..ffn import swiglu_hidden_dim

ACTIVATIONS = {  # a config's activation name -> (the function in words, the GLU it makes when gated)
    "silu": ("SiLU (Swish), x·σ(x)", "SwiGLU"),
    "swish": ("SiLU (Swish), x·σ(x)", "SwiGLU"),
    "gelu": ("GELU (exact, with erf)", "GeGLU"),
    "gelu_pytorch_tanh": ("GELU (tanh approximation)", "GeGLU"),
    "gelu_new": ("GELU (tanh approximation)", "GeGLU"),
    "gelu_fast": ("GELU (fast tanh approximation)", "GeGLU"),
    "relu": ("ReLU", "ReGLU"),
    "relu2": ("squared ReLU, max(0, x)²", "a gated squared ReLU"),
}
META_RULES = {  # (d, d_ff) -> (the model, multiple_of, ffn_dim_multiplier) from Meta's params.json
    (4096, 11008): ("Llama 2 7B", 256, None),
    (5120, 13824): ("Llama 2 13B", 256, None),
    (8192, 28672): ("Llama 2 70B and Llama 3 70B", 4096, 1.3),
    (4096, 14336): ("Llama 3 8B", 1024, 1.3),
    (16384, 53248): ("Llama 3.1 405B", 4096, 1.2),
}
POWERS = tuple(2**k for k in range(4, 13))  # 16 .. 4,096: the multiple_of values tried


def activation_text(name: str, gated: bool, family: str) -> str:
    """What the activation field's value makes of the FFN."""
    if family == "gpt_oss":
        return ("not read: gpt-oss's experts compute their own clamped SwiGLU, (up + 1)·g·σ(swiglu_alpha·g), "
                "with gate and up clamped at swiglu_limit")
    if name not in ACTIVATIONS:
        return f"{name!r}: an activation this card does not explain (it has no parameters of its own here)"
    words, glu = ACTIVATIONS[name]
    return f"{words}: the gate's activation, so the FFN is a {glu}" if gated else (
        f"{words}: a plain two-matrix MLP, activation between up and down")


def ffn_kind(name: str, gated: bool, family: str) -> str:
    """The FFN in a word or two: its GLU when gated (SwiGLU, GeGLU, ...), else a plain MLP and its activation."""
    if family == "gpt_oss":
        return "clamped SwiGLU"
    words, glu = ACTIVATIONS.get(name, (repr(name), f"GLU with {name!r}"))
    return glu if gated else f"plain MLP ({words.split(',')[0]})"


def llama_rule_fits(d: int, d_ff: int) -> list[tuple[float | None, list[int]]]:
    """Every (ffn_dim_multiplier, multiple_of values) for which Llama's rule gives ``d_ff`` from ``d``."""
    fits = []
    for mult in (None, 1.3, 1.2):
        ms = [m for m in POWERS if swiglu_hidden_dim(d, m, mult) == d_ff]
        if ms:
            fits.append((mult, ms))
    return fits


def ratio_text(d: int, d_ff: int) -> str:
    if int(8 * d / 3) == d_ff:
        return "8/3·d exactly"
    ratio = d_ff / d
    return f"{ratio:g}·d" if (4 * ratio).is_integer() else f"d_ff/d = {ratio:.3f}"


def ffn_rule(d: int, d_ff: int, model_type: str | None = None) -> str:
    """``d_ff`` against ``d``: its ratio, the published rule that gives it (Meta's, for a Llama), or the Llama
    arithmetic that reproduces it without being that model's rule, or none."""
    ratio = ratio_text(d, d_ff)
    if model_type == "llama" and (d, d_ff) in META_RULES:
        name, multiple_of, mult = META_RULES[(d, d_ff)]
        how = f"int(8/3·d){f' × {mult:g}' if mult else ''} rounded up to a multiple of {multiple_of:,}"
        return f"{ratio}: Meta's rule for {name}, {how}"
    fits = llama_rule_fits(d, d_ff)
    if ratio == "8/3·d exactly" or d_ff % d == 0:  # a whole multiple of d is a rule of its own
        return ratio
    if not fits:
        return f"{ratio}: no rounded 8/3·d rule gives it"
    mult, ms = fits[0]
    how = f"int(8/3·d){f' × {mult:g}' if mult else ''} rounded up to a multiple of {' or '.join(f'{m:,}' for m in ms)}"
    return f"{ratio} (Llama's arithmetic, {how}, gives the same width; no rule is credited to this model)"
