"""Lesson 06: QK-norm, alone and inside the attention module."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...rmsnorm import RMSNorm
from ...rope import rope_cache
from .core import (
    call_student,
    exercise_check,
    fail,
    generator,
    judge,
    randomize,
)
from .lesson04 import GQA_LOAD_HINTS, grade_attention_module
from .reference import rms_norm64, rope64


@exercise_check(components=("GQAttention",), uses=("RMSNorm", "apply_rope"))
def check_qk_norm_rope(qk_norm_rope) -> str:
    """``qk_norm_rope(q, k, q_norm, k_norm, cos, sin)`` → (q, k): each head's q and k normalised by their
    own RMSNorm, then rotated by RoPE."""
    __tracebackhide__ = True
    name = "check_qk_norm_rope"
    g = generator(11)
    for desc, B, h, kv, T, dh in (("q [2, 4, 5, 8], k [2, 2, 5, 8]", 2, 4, 2, 5, 8),
                                  ("q [1, 2, 3, 16], k [1, 1, 3, 16] (one KV head)", 1, 2, 1, 3, 16)):
        qn, kn = randomize(RMSNorm(dh), 50), randomize(RMSNorm(dh), 51)
        q, k = torch.randn(B, h, T, dh, generator=g) * 3, torch.randn(B, kv, T, dh, generator=g) * 3
        cos, sin = rope_cache(T + 10, dh)
        cos, sin = cos[10:], sin[10:]
        out = call_student(name, f"qk_norm_rope with {desc}", qk_norm_rope, q.clone(), k.clone(), qn, kn, cos, sin)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            fail(name, f"qk_norm_rope must return a pair (q, k), got {type(out).__name__}.")
        wq, wk = qn.weight.double(), kn.weight.double()

        def n(t, w):
            return rms_norm64(t, w, 1e-6)

        def r(t, cos=cos, sin=sin):
            return rope64(t, cos, sin)

        for which, got, x, w, w_other in (("q", out[0], q, wq, wk), ("k", out[1], k, wk, wq)):
            cands: list[tuple[str, Callable[..., torch.Tensor]]] = [
                ("QK-norm after RoPE: normalise first, then rotate. With a learned per-feature scale the two "
                 "orders differ (the scale would act on rotated coordinates).", lambda x=x, w=w: n(r(x), w)),
                ("q_norm and k_norm were swapped: q goes through q_norm, k through k_norm.",
                 lambda x=x, w=w_other: r(n(x, w))),
                ("q or k was not normalised: apply q_norm to q and k_norm to k, before RoPE.", lambda x=x: r(x)),
                ("q or k was not rotated: apply RoPE to q and k, after the norm.", lambda x=x, w=w: n(x, w)),
                ("the mean was subtracted (LayerNorm); QK-norm here is RMSNorm.",
                 lambda x=x, w=w: r(rms_norm64(x, w, 1e-6, center=True))),
            ]
            judge(name, got, r(n(x, w)), cands, f"{which} with {desc}", dims=("head", "position", ""))
    return "2 cases: GQA and one KV head, random norm scales"


@exercise_check(components=("GQAttention", "causal_attention"), uses=("RMSNorm", "apply_rope"))
def check_qk_norm_attention(QKNormAttentionClass) -> str:
    """``QKNormAttention(d, n_heads, n_kv_heads)``: GQA attention with per-head RMSNorm on q and k (before
    RoPE), attributes wq/wk/wv/wo/q_norm/k_norm, ``forward(x, cos, sin)``."""
    __tracebackhide__ = True
    name = "check_qk_norm_attention"
    hints = dict(GQA_LOAD_HINTS)
    hints["q_norm"] = ("QK-norm normalises each head's vector: self.q_norm = RMSNorm(head_dim) and self.k_norm = "
                       "RMSNorm(head_dim), not RMSNorm(d) (and not LayerNorm, which has a bias).")
    hints["k_norm"] = hints["q_norm"]

    def make(d, h, kv, qk_norm):
        return call_student(name, f"QKNormAttention({d}, {h}, {kv})", QKNormAttentionClass, d, h, kv)

    return grade_attention_module(name, make, qk_norm_cases=True, load_hints=hints)
