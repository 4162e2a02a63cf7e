"""Lesson 02: Llama's SwiGLU hidden size, the SwiGLU layer and the FFN weight count."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.nn.functional as F

from ...ffn import SwiGLU, swiglu_hidden_dim
from .core import (
    call_student,
    dtype_name,
    exercise_check,
    fail,
    generator,
    is_graded,
    judge,
    judge_int,
    load_weights,
    pick,
    randomize,
)


def _hidden_candidates(d, multiple_of, mult):
    """Wrong versions of Llama's hidden-size rule, each as (diagnosis, value)."""
    def up(h):
        return multiple_of * math.ceil(h / multiple_of)

    base = int(2 * (4 * d) / 3)
    h = int(mult * base) if mult is not None else base
    c = [
        ("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.", up(4 * d)),
        ("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.", 4 * d),
        ("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.",
         up(int(mult * 4 * d)) if mult is not None else None),
        ("not rounded up to a multiple of multiple_of: Llama rounds int(8/3·d) up to the next multiple.", h),
        ("rounded down instead of up (floor); Llama rounds up: multiple_of·ceil(h / multiple_of).",
         multiple_of * (h // multiple_of)),
        ("rounded to the nearest multiple; Llama rounds up: multiple_of·ceil(h / multiple_of).",
         multiple_of * round(h / multiple_of)),
        ("always adds one multiple ((h // m + 1)·m): when h is already a multiple it must stay as it is.",
         (h // multiple_of + 1) * multiple_of),
        ("used 2/3·d: the 2/3 applies to GPT-2's 4d hidden size, i.e. 2/3·4d = 8/3·d.", up(int(2 * d / 3))),
        ("8/3·d was not truncated to an int before the multiplier and the rounding: Llama computes "
         "int(2·4d/3) first.", up(int(mult * (8 * d / 3)) if mult is not None else math.ceil(8 * d / 3))),
    ]
    if mult is not None:
        r = up(base)
        c += [("ffn_dim_multiplier is ignored: multiply the hidden size by it before rounding.", up(base)),
              ("the multiplier was applied after rounding: apply ffn_dim_multiplier to int(8/3·d), then round up.",
               int(mult * r)),
              ("the multiplier was applied after rounding: apply ffn_dim_multiplier to int(8/3·d), then round up.",
               up(int(mult * r))),
              ("the multiplier was applied to d rather than to the hidden size (or the product was not truncated).",
               up(int(2 * (4 * int(mult * d)) / 3)))]
    return c


@exercise_check(components=("swiglu_hidden_dim",))
def check_swiglu_hidden_dim(swiglu_hidden_dim_fn) -> str:
    """``swiglu_hidden_dim(d, multiple_of=256, ffn_dim_multiplier=None)``: Llama's rule."""
    __tracebackhide__ = True
    name = "check_swiglu_hidden_dim"
    cases = [(4096, None, None), (5120, None, None), (4096, 1024, 1.3), (256, 16, None), (1000, None, None),
             (4096, 1, None), (768, 64, None), (100, 8, 1.5), (7, 1, None)]
    if is_graded():  # hidden cases drawn from the grader's secret: a table of the public answers does not pass
        g = generator(20)
        # d >= 1024 and the first case without a multiplier: there the answer is never GPT-2's 4d (with
        # ffn_dim_multiplier=1.5 it is exactly 4d for every d = 64k, so a table falling back to 4d could pass)
        cases += [(64 * int(torch.randint(16, 256, (1,), generator=g)), pick(g, [16, 64, 128, 256, 1024]),
                   None if i == 0 else pick(g, [None, 1.3, 1.5])) for i in range(3)]
    for d, m, mult in cases:
        args = (d,) if m is None else (d, m) if mult is None else (d, m, mult)
        call = f"swiglu_hidden_dim({', '.join(map(str, args))})"
        got = call_student(name, call, swiglu_hidden_dim_fn, *args)
        want = swiglu_hidden_dim(d, m or 256, mult)
        judge_int(name, got, want, _hidden_candidates(d, m or 256, mult), call,
                  hint="int(2·4d/3), times ffn_dim_multiplier if given (then int), rounded up to a multiple "
                       "of multiple_of.")
    return "9 cases incl. Llama 11,008, d=5120 → 13,824, Llama 3 8B 14,336, exact multiples"


def _swiglu64(x, wg, wu, wd, act="silu", mode="gate"):
    x = x.double()
    g, u = x @ wg.double().T, x @ wu.double().T
    acts = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
            "relu": F.relu, "sigmoid": torch.sigmoid, "none": lambda t: t}
    a = acts[act]
    hidden = {"gate": lambda: a(g) * u, "swap": lambda: a(u) * g, "gate_only": lambda: a(g),
              "up_only": lambda: a(u), "after": lambda: a(g * u)}[mode]()
    return hidden @ wd.double().T


@exercise_check(components=("SwiGLU",))
def check_swiglu(SwiGLUClass) -> str:
    """``SwiGLU(d, d_ff)`` with bias-free ``w_gate``, ``w_up`` (d → d_ff) and ``w_down`` (d_ff → d)."""
    __tracebackhide__ = True
    name = "check_swiglu"
    d, d_ff = 16, 40
    ref = randomize(SwiGLU(d, d_ff), 2)
    student = call_student(name, f"SwiGLU({d}, {d_ff})", SwiGLUClass, d, d_ff)
    load_weights(name, student, ref, {"w_gate": "Name the layers w_gate, w_up (d → d_ff) and w_down (d_ff → d).",
                                      "w_down": "w_down maps d_ff back to d: nn.Linear(d_ff, d, bias=False)."})
    wg, wu, wd = ref.w_gate.weight, ref.w_up.weight, ref.w_down.weight
    g = generator(3)
    cases = [("x of shape [2, 5, 16]", torch.randn(2, 5, d, generator=g)),
             ("x of shape [1, 1, 16]", torch.randn(1, 1, d, generator=g)),
             ("x of shape [3, 16] (no batch dimension)", torch.randn(3, d, generator=g) * 3)]
    for desc, x in cases:
        got = call_student(name, f"forward on {desc}", student, x.clone())
        want = _swiglu64(x, wg, wu, wd)
        mk = partial(_swiglu64, x, wg, wu, wd)
        cands = [
            ("SiLU was applied to w_up's output instead of w_gate's (gate and up swapped): "
             "w_down(silu(w_gate(x)) * w_up(x)).", partial(mk, mode="swap")),
            ("GELU instead of SiLU/Swish (that is GeGLU). SwiGLU uses silu(z) = z·sigmoid(z).",
             partial(mk, act="gelu")),
            ("GELU (tanh approximation) instead of SiLU/Swish. SwiGLU uses silu(z) = z·sigmoid(z).",
             partial(mk, act="gelu_tanh")),
            ("ReLU instead of SiLU/Swish (that is ReGLU).", partial(mk, act="relu")),
            ("the gate is sigmoid(w_gate x), the original GLU; SwiGLU uses Swish: silu(z) = z·sigmoid(z).",
             partial(mk, act="sigmoid")),
            ("no gating: the w_up branch is missing; multiply silu(w_gate(x)) elementwise by w_up(x).",
             partial(mk, mode="gate_only")),
            ("no gating: the w_gate branch is missing; multiply silu(w_gate(x)) elementwise by w_up(x).",
             partial(mk, mode="up_only")),
            ("SiLU was applied to the product: silu(w_gate(x) * w_up(x)); only the gate goes through SiLU.",
             partial(mk, mode="after")),
            ("no activation at all (a bilinear layer): apply silu to w_gate(x).", partial(mk, act="none")),
        ]
        judge(name, got, want, cands, f"on {desc}", hint="SwiGLU(x) = w_down(silu(w_gate(x)) * w_up(x)).")
    x = torch.randn(2, 4, d, generator=g).to(torch.bfloat16)
    m = call_student(name, "module.to(torch.bfloat16)", student.to, torch.bfloat16)
    got = call_student(name, "forward on a bfloat16 x of shape [2, 4, 16]", m, x)
    ref_bf = ref.to(torch.bfloat16)
    judge(name, got, _swiglu64(x, ref_bf.w_gate.weight, ref_bf.w_up.weight, ref_bf.w_down.weight), [],
          "on a bfloat16 x of shape [2, 4, 16]", rtol=3e-2, atol=3e-2)
    if got.dtype != torch.bfloat16:
        fail(name, f"a bfloat16 input gave a {dtype_name(got)} output; keep the input's dtype.")
    return "4 cases: 3-D and 2-D inputs, batch 1, bfloat16"


@exercise_check(components=("SwiGLU", "GeluMLP", "count_parameters", "parameter_breakdown"))
def check_ffn_weight_count(ffn_weight_count) -> str:
    """``ffn_weight_count(d, d_ff, gated)``: weights of a bias-free FFN: 2·d·d_ff (GELU MLP) or
    3·d·d_ff (SwiGLU)."""
    __tracebackhide__ = True
    name = "check_ffn_weight_count"
    cases = [(4096, 16384, False), (4096, 11008, True), (5120, 13824, True), (64, 256, False), (64, 170, True)]
    if is_graded():  # hidden cases drawn from the grader's secret: a table of the public answers does not pass
        g = generator(21)
        cases += [(int(torch.randint(8, 9000, (1,), generator=g)), int(torch.randint(8, 30000, (1,), generator=g)),
                   pick(g, [False, True])) for _ in range(3)]
    for d, d_ff, gated in cases:
        call = f"ffn_weight_count({d}, {d_ff}, gated={gated})"
        got = call_student(name, call, ffn_weight_count, d, d_ff, gated)
        want = (3 if gated else 2) * d * d_ff
        cands = [
            ("a SwiGLU FFN has three matrices (w_gate, w_up, w_down): 3·d·d_ff." if gated else
             "a GELU MLP has two matrices (up and down): 2·d·d_ff.", (2 if gated else 3) * d * d_ff),
            ("biases were counted; the modern FFN has none (and the exercise counts weights only).",
             want + (2 * d_ff + d if gated else d_ff + d)),
            ("d_ff was ignored and 4d used: count with the d_ff you are given.", (3 if gated else 2) * d * 4 * d),
            (f"only one matrix counted: the FFN has {3 if gated else 2}.", d * d_ff),
            ("the sizes are squared: each matrix is d × d_ff, not d_ff × d_ff or d × d.",
             (3 if gated else 2) * d_ff * d_ff),
        ]
        judge_int(name, got, want, cands, call, hint="GELU MLP: 2·d·d_ff; SwiGLU: 3·d·d_ff (no biases).")
    return "5 cases incl. 8d² = 134,217,728 and Llama's 135,266,304"


@exercise_check(value="llama3_70b_d_ff")
def check_llama3_70b_d_ff(d_ff) -> str:
    """``llama3_70b_d_ff``: Llama 3 70B's SwiGLU width by Llama's rule (d = 8192, multiple_of = 4096,
    ffn_dim_multiplier = 1.3)."""
    __tracebackhide__ = True
    d = 8192
    cands = [
        ("4d is GPT-2's width: SwiGLU starts from 8/3·d.", 4 * d),
        ("the multiplier 1.3 was left out: Llama 3 scales int(8/3·d) by ffn_dim_multiplier before rounding.",
         swiglu_hidden_dim(d, 4096)),
        ("rounded to a multiple of 256 (Llama 2's multiple_of); Llama 3 70B rounds up to a multiple of 4096.",
         swiglu_hidden_dim(d, 256, 1.3)),
        ("rounded to a multiple of 1024 (Llama 3 8B's multiple_of); Llama 3 70B rounds up to a multiple of 4096.",
         swiglu_hidden_dim(d, 1024, 1.3)),
        ("not rounded up to a multiple of multiple_of.", int(1.3 * int(8 * d / 3))),
        ("8/3·d alone: no multiplier, no rounding.", int(8 * d / 3)),
    ]
    judge_int("check_llama3_70b_d_ff", d_ff, swiglu_hidden_dim(d, 4096, 1.3), cands, "llama3_70b_d_ff",
              reveal=False)
    return "28,672 = 3.5·d"
