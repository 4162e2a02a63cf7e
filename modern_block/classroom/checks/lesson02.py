"""Lesson 02: Llama's SwiGLU hidden size, the SwiGLU layer and the FFN weight count."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ...ffn import SwiGLU, swiglu_hidden_dim
from .core import Case, CheckRun, Mistake, dtype_name, exercise_check

# ---- exercise 1: Llama's rule ----------------------------------------------------------------------------


def _up(h: float, m: int) -> int:
    return m * math.ceil(h / m)


def _base(c: Case) -> int:
    return int(2 * (4 * c.d) / 3)


def _scaled(c: Case) -> int:
    return int(c.mult * _base(c)) if c.mult is not None else _base(c)


def _with_mult(c: Case) -> bool:
    return c.mult is not None


HIDDEN_MISTAKES = [
    Mistake("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.",
            lambda c: _up(4 * c.d, c.m), lambda c: 4 * c.d,
            lambda c: _up(int(c.mult * 4 * c.d), c.m) if c.mult is not None else None),
    Mistake("not rounded up to a multiple of multiple_of: Llama rounds int(8/3·d) up to the next multiple.", _scaled),
    Mistake("rounded down instead of up (floor); Llama rounds up: multiple_of·ceil(h / multiple_of).",
            lambda c: c.m * (_scaled(c) // c.m)),
    Mistake("rounded to the nearest multiple; Llama rounds up: multiple_of·ceil(h / multiple_of).",
            lambda c: c.m * round(_scaled(c) / c.m)),
    Mistake("always adds one multiple ((h // m + 1)·m): when h is already a multiple it must stay as it is.",
            lambda c: (_scaled(c) // c.m + 1) * c.m),
    Mistake("used 2/3·d: the 2/3 applies to GPT-2's 4d hidden size, i.e. 2/3·4d = 8/3·d.",
            lambda c: _up(int((c.mult or 1) * int(2 * c.d / 3)), c.m), lambda c: _up(int(2 * c.d / 3), c.m)),
    Mistake("8/3·d was not truncated to an int before the multiplier and the rounding: Llama computes int(2·4d/3) "
            "first.", lambda c: _up(8 * c.d / 3 * (c.mult or 1), c.m), lambda c: _up(int(8 * c.d / 3 * (c.mult or 1)),
                                                                                   c.m)),
    Mistake("ffn_dim_multiplier is ignored: multiply the hidden size by it before rounding.",
            lambda c: _up(_base(c), c.m), when=_with_mult),
    Mistake("the multiplier was applied after rounding: apply ffn_dim_multiplier to int(8/3·d), then round up.",
            lambda c: int(c.mult * _up(_base(c), c.m)), lambda c: _up(int(c.mult * _up(_base(c), c.m)), c.m),
            when=_with_mult),
    Mistake("the multiplier was applied to d rather than to the hidden size: Llama computes int(8/3·d) first, then "
            "int(ffn_dim_multiplier · that).", lambda c: _up(int(2 * (4 * int(c.mult * c.d)) / 3), c.m),
            when=_with_mult),
]


def _hidden_case(d: int, m: int | None, mult: float | None) -> Case:
    args = (d,) if m is None else (d, m) if mult is None else (d, m, mult)
    return Case(f"swiglu_hidden_dim({', '.join(map(str, args))})", partial(swiglu_hidden_dim, d, m or 256, mult), args,
                d=d, m=m or 256, mult=mult)


@exercise_check
def check_swiglu_hidden_dim(run: CheckRun, swiglu_hidden_dim_fn) -> str:
    """``swiglu_hidden_dim(d, multiple_of=256, ffn_dim_multiplier=None)``: Llama's rule."""
    public = [_hidden_case(*c) for c in [(4096, None, None), (5120, None, None), (4096, 1024, 1.3), (256, 16, None),
                                         (1000, None, None), (4096, 1, None), (4096, 1, 1.3), (768, 64, None),
                                         (100, 8, 1.5), (1000, 1, 1.3), (7, 1, None)]]

    def secret(g):  # d >= 1024 and the first case without a multiplier: there the answer is never GPT-2's 4d
        return [_hidden_case(64 * run.randint(g, 16, 256), run.pick(g, [1, 16, 64, 128, 256, 1024]),
                             None if i == 0 else run.pick(g, [None, 1.3, 1.5])) for i in range(3)]

    run.judge_each(swiglu_hidden_dim_fn, run.cases(public, secret, seed=20), run.judge_int, HIDDEN_MISTAKES)
    return "11 cases incl. Llama 11,008, d=5120 → 13,824, Llama 3 8B 14,336, exact multiples, multiple_of = 1"


# ---- exercise 2: the layer -------------------------------------------------------------------------------


def _swiglu64(x, wg, wu, wd, act="silu", mode="gate"):
    x = x.double()
    g, u = x @ wg.double().T, x @ wu.double().T
    acts = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "relu": F.relu, "sigmoid": torch.sigmoid, "none": lambda t: t}
    a = acts[act]
    hidden = {"gate": lambda: a(g) * u, "swap": lambda: a(u) * g, "gate_only": lambda: a(g),
              "up_only": lambda: a(u), "after": lambda: a(g * u)}[mode]()
    return hidden @ wd.double().T


SWIGLU_MISTAKES = [
    Mistake("SiLU was applied to w_up's output instead of w_gate's (gate and up swapped): "
            "w_down(silu(w_gate(x)) * w_up(x)).", dict(mode="swap")),
    Mistake("GELU instead of SiLU/Swish (that is GeGLU). SwiGLU uses silu(z) = z·sigmoid(z).", dict(act="gelu")),
    Mistake("GELU (tanh approximation) instead of SiLU/Swish. SwiGLU uses silu(z) = z·sigmoid(z).",
            dict(act="gelu_tanh")),
    Mistake("ReLU instead of SiLU/Swish (that is ReGLU).", dict(act="relu")),
    Mistake("the gate is sigmoid(w_gate x), the original GLU; SwiGLU uses Swish: silu(z) = z·sigmoid(z).",
            dict(act="sigmoid")),
    Mistake("no gating: the w_up branch is missing; multiply silu(w_gate(x)) elementwise by w_up(x).",
            dict(mode="gate_only")),
    Mistake("no gating: the w_gate branch is missing; multiply silu(w_gate(x)) elementwise by w_up(x).",
            dict(mode="up_only")),
    Mistake("SiLU was applied to the product: silu(w_gate(x) * w_up(x)); only the gate goes through SiLU.",
            dict(mode="after")),
    Mistake("no activation at all (a bilinear layer): apply silu to w_gate(x).", dict(act="none")),
]


@exercise_check
def check_swiglu(run: CheckRun, SwiGLUClass) -> str:
    """``SwiGLU(d, d_ff)`` with bias-free ``w_gate``, ``w_up`` (d → d_ff) and ``w_down`` (d_ff → d)."""
    d, d_ff = 16, 40
    ref = run.randomize(SwiGLU(d, d_ff), 2)
    student = run.call(f"SwiGLU({d}, {d_ff})", SwiGLUClass, d, d_ff)
    run.load_weights(student, ref, {"w_gate": "Name the layers w_gate, w_up (d → d_ff) and w_down (d_ff → d).",
                                    "w_down": "w_down maps d_ff back to d: nn.Linear(d_ff, d, bias=False)."})
    weights = tuple(w.detach().clone() for w in (ref.w_gate.weight, ref.w_up.weight, ref.w_down.weight))
    g = run.rng(3)

    def case(x, text):
        return Case(f"forward on {text}", partial(_swiglu64, x, *weights), (x,))

    public = [case(torch.randn(2, 5, d, generator=g), "x of shape [2, 5, 16]"),
              case(torch.randn(1, 1, d, generator=g), "x of shape [1, 1, 16]"),
              case(torch.randn(3, d, generator=g) * 3, "x of shape [3, 16] (no batch dimension)")]

    def secret(g):
        n = run.randint(g, 1, 6)
        return [case(torch.randn(n, run.randint(g, 1, 5), d, generator=g) * run.pick(g, [0.5, 2.0]),
                     f"x of shape [{n}, .., 16]")]

    run.judge_each(student, run.cases(public, secret, seed=103), run.judge, SWIGLU_MISTAKES,
                   hint="SwiGLU(x) = w_down(silu(w_gate(x)) * w_up(x)).")
    x = torch.randn(2, 4, d, generator=g).to(torch.bfloat16)
    m = run.call("module.to(torch.bfloat16)", student.to, torch.bfloat16)
    got = run.call("forward on a bfloat16 x of shape [2, 4, 16]", m, x)
    ref_bf = ref.to(torch.bfloat16)
    bf = Case("on a bfloat16 x of shape [2, 4, 16]",
              partial(_swiglu64, x, ref_bf.w_gate.weight, ref_bf.w_up.weight, ref_bf.w_down.weight))
    run.judge(bf, got, rtol=3e-2, atol=3e-2)
    run.require(getattr(got, "dtype", None) == torch.bfloat16, bf.text,
                f"a bfloat16 input gave a {dtype_name(got)} output; keep the input's dtype.")
    return "4 cases: 3-D and 2-D inputs, batch 1, bfloat16"


# ---- exercise 3: the weight count ------------------------------------------------------------------------


def _ffn_weights(d: int, d_ff: int, gated: bool, *, matrices=None, biases=False, width=None, square=None) -> int:
    n = matrices if matrices is not None else (3 if gated else 2)
    a, b = (d_ff, d_ff) if square == "d_ff" else (d, d) if square == "d" else (d, width or d_ff)
    return n * a * b + ((2 * d_ff + d if gated else d_ff + d) if biases else 0)


FFN_MISTAKES = [
    Mistake("a GELU MLP has two matrices (up and down): 2·d·d_ff.", dict(matrices=3), when=lambda c: not c.gated),
    Mistake("a SwiGLU FFN has three matrices (w_gate, w_up, w_down): 3·d·d_ff.", dict(matrices=2),
            when=lambda c: c.gated),
    Mistake("biases were counted; the modern FFN has none (and the exercise counts weights only).",
            dict(biases=True)),
    Mistake("d_ff was ignored and 4d used: count with the d_ff you are given.",
            lambda c: _ffn_weights(c.d, c.d_ff, c.gated, width=4 * c.d)),
    Mistake("the GELU MLP was counted as 8d², which holds only when d_ff = 4d: count 2·d·d_ff with the d_ff you are "
            "given.", lambda c: 8 * c.d * c.d, when=lambda c: not c.gated),
    Mistake("only one matrix counted.", dict(matrices=1)),
    Mistake("the sizes are squared: each matrix is d × d_ff, not d_ff × d_ff or d × d.", dict(square="d_ff"),
            dict(square="d")),
]


def _ffn_case(d: int, d_ff: int, gated: bool) -> Case:
    return Case(f"ffn_weight_count({d}, {d_ff}, gated={gated})", partial(_ffn_weights, d, d_ff, gated),
                (d, d_ff, gated), d=d, d_ff=d_ff, gated=gated)


@exercise_check
def check_ffn_weight_count(run: CheckRun, ffn_weight_count) -> str:
    """``ffn_weight_count(d, d_ff, gated)``: weights of a bias-free FFN: 2·d·d_ff (GELU MLP) or 3·d·d_ff
    (SwiGLU)."""
    public = [_ffn_case(*c) for c in [(4096, 16384, False), (4096, 11008, True), (5120, 13824, True), (64, 256, False),
                                      (64, 170, True), (1024, 2816, False)]]

    def secret(g):
        return [_ffn_case(run.randint(g, 8, 9000), run.randint(g, 8, 30000), run.pick(g, [False, True]))
                for _ in range(3)]

    run.judge_each(ffn_weight_count, run.cases(public, secret, seed=21), run.judge_int, FFN_MISTAKES)
    return "6 cases incl. 8d² = 134,217,728, Llama's 135,266,304 and a GELU MLP narrower than 4d"


# ---- exercise 4: Llama 3 70B's width, by value ------------------------------------------------------------

D_FF_MISTAKES = [
    Mistake("4d is GPT-2's width: SwiGLU starts from 8/3·d.", lambda c: 4 * c.d),
    *HIDDEN_MISTAKES[1:],
    Mistake("rounded to a multiple of 256 (Llama 2's multiple_of); Llama 3 70B rounds up to a multiple of 4096.",
            lambda c: swiglu_hidden_dim(c.d, 256, c.mult)),
    Mistake("rounded to a multiple of 1024 (Llama 3 8B's multiple_of); Llama 3 70B rounds up to a multiple of 4096.",
            lambda c: swiglu_hidden_dim(c.d, 1024, c.mult)),
    Mistake("8/3·d alone: no multiplier, no rounding.", _base),
]


@exercise_check(value="llama3_70b_d_ff")
def check_llama3_70b_d_ff(run: CheckRun, d_ff) -> str:
    """``llama3_70b_d_ff``: Llama 3 70B's SwiGLU width by Llama's rule (d = 8192, multiple_of = 4096,
    ffn_dim_multiplier = 1.3)."""
    case = Case("llama3_70b_d_ff", partial(swiglu_hidden_dim, 8192, 4096, 1.3), d=8192, m=4096, mult=1.3)
    run.judge_int(case, d_ff, D_FF_MISTAKES)
    return "28,672 = 3.5·d"
