"""Lesson 06: QK-norm, alone and inside the attention module."""

from __future__ import annotations

from functools import partial

import torch

from ...rmsnorm import RMSNorm
from ...rope import rope_cache
from .core import Case, CheckRun, Mistake, exercise_check
from .formulas import rms_norm64, rope64
from .lesson04 import GQA_LOAD_HINTS, grade_attention_module


def _qk64(x, w, w_other, cos, sin, *, order="norm_first", norm="own", rotate=True, center=False):
    """One of q or k, normalised per head by its own RMSNorm then rotated, in float64, with a knob per mistake."""
    weight = {"own": w, "other": w_other}.get(norm)
    normed = x.double() if weight is None else rms_norm64(x, weight.double(), 1e-6, center=center)
    if order == "rotate_first":
        return rms_norm64(rope64(x, cos, sin), w.double(), 1e-6)
    return rope64(normed, cos, sin) if rotate else normed


QK_MISTAKES = [
    Mistake("QK-norm after RoPE: normalise first, then rotate. With a learned per-feature scale the two orders "
            "differ (the scale would act on rotated coordinates).", dict(order="rotate_first")),
    Mistake("q_norm and k_norm were swapped: q goes through q_norm, k through k_norm.", dict(norm="other")),
    Mistake("q or k was not normalised: apply q_norm to q and k_norm to k, before RoPE.", dict(norm="none")),
    Mistake("q or k was not rotated: apply RoPE to q and k, after the norm.", dict(rotate=False)),
    Mistake("the mean was subtracted (LayerNorm); QK-norm here is RMSNorm.", dict(center=True)),
]


@exercise_check
def check_qk_norm_rope(run: CheckRun, qk_norm_rope) -> str:
    """``qk_norm_rope(q, k, q_norm, k_norm, cos, sin)`` → (q, k): each head's q and k normalised by their own
    RMSNorm, then rotated by RoPE."""
    g = run.rng(11)

    def case(desc, B, h, kv, T, dh, offset):
        qn, kn = run.randomize(RMSNorm(dh), 50), run.randomize(RMSNorm(dh), 51)
        q, k = torch.randn(B, h, T, dh, generator=g) * 3, torch.randn(B, kv, T, dh, generator=g) * 3
        cos, sin = (t[offset:] for t in rope_cache(T + offset, dh))
        wq, wk = qn.weight, kn.weight
        return Case(f"qk_norm_rope with {desc}", lambda: None, (q, k, qn, kn, cos, sin), desc=desc,
                    q=Case(f"q with {desc}", partial(_qk64, q, wq, wk, cos, sin)),
                    k=Case(f"k with {desc}", partial(_qk64, k, wk, wq, cos, sin)))

    public = [case("q [2, 4, 5, 8], k [2, 2, 5, 8]", 2, 4, 2, 5, 8, 10),
              case("q [1, 2, 3, 16], k [1, 1, 3, 16] (one KV head)", 1, 2, 1, 3, 16, 10)]

    def secret(g):
        kv, T, dh = run.randint(g, 1, 3), run.randint(g, 1, 6), 2 * run.randint(g, 2, 9)
        return [case(f"q [2, {2 * kv}, {T}, {dh}], k [2, {kv}, {T}, {dh}] at drawn positions", 2, 2 * kv, kv, T, dh,
                     run.randint(g, 0, 100))]

    for c in run.cases(public, secret, seed=111):
        out = run.call(c.text, qk_norm_rope, *c.args)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            run.fail(f"qk_norm_rope must return a pair (q, k), got {type(out).__name__}.")
        for part, got in zip((c.q, c.k), out, strict=True):
            run.judge(part, got, QK_MISTAKES, dims=("head", "position", ""))
    return "2 cases: GQA and one KV head, random norm scales"


@exercise_check
def check_qk_norm_attention(run: CheckRun, QKNormAttentionClass) -> str:
    """``QKNormAttention(d, n_heads, n_kv_heads)``: GQA attention with per-head RMSNorm on q and k (before RoPE),
    attributes wq/wk/wv/wo/q_norm/k_norm, ``forward(x, cos, sin)``."""
    hints = dict(GQA_LOAD_HINTS)
    hints["q_norm"] = hints["k_norm"] = ("QK-norm normalises each head's vector: self.q_norm = RMSNorm(head_dim) and "
                                         "self.k_norm = RMSNorm(head_dim), not RMSNorm(d) (and not LayerNorm, which "
                                         "has a bias).")

    def make(d, h, kv, qk_norm):
        return run.call(f"QKNormAttention({d}, {h}, {kv})", QKNormAttentionClass, d, h, kv)

    return grade_attention_module(run, make, qk_norm=True, load_hints=hints)
