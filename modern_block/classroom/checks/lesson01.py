"""Lesson 01: the root mean square and the RMSNorm layer."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn as nn

from .core import Case, CheckRun, Mistake, dtype_name, exercise_check, shape_of
from .formulas import rms64, rms_norm64

_HALF = ("x² overflows float16 above 65,504 (|x| > 256) and underflows below 6e-8 (|x| < 2.4e-4)")


def _wrong_dim(c: Case):
    x = c.x
    if x.dim() > 2:
        return rms_norm64(x, c.w, c.eps, dim=-2)
    return rms_norm64(x, c.w, c.eps, dim=0) if x.dim() > 1 and x.shape[0] > 1 else None


# ---- exercise 1: the statistic ---------------------------------------------------------------------------


def _rms64(x, eps, *, no_eps=False, inverse=False, dim=-1, keepdim=True, **knobs):
    """The statistic, with the knobs of ``rms64`` and a few more."""
    out = rms64(x, 0.0 if no_eps else eps, dim=dim, **knobs)
    out = 1 / out if inverse else out
    return out if keepdim else out.squeeze(dim)


RMS_MISTAKES = [
    Mistake("the mean was subtracted: that is the standard deviation (LayerNorm's statistic). RMS does not "
            "center x: sqrt(mean(x²) + eps).", dict(center=True)),
    Mistake("the mean was subtracted (torch.std / var, the unbiased version): RMS uses mean(x²) of the raw x, no "
            "centering.", dict(center=True, unbiased=True), lambda c: c.x.double().std(-1, keepdim=True)),
    Mistake("eps was added outside the square root: sqrt(mean(x²)) + eps. It belongs inside: sqrt(mean(x²) + eps).",
            dict(eps_outside=True)),
    Mistake("eps is missing: sqrt(mean(x²) + eps) keeps tiny vectors from dividing by ~0.", dict(no_eps=True)),
    Mistake("the square root is missing: that is the mean square, not its root.", dict(no_sqrt=True)),
    Mistake("the sum of squares was used instead of the mean (x.norm() is sqrt(sum(x²))): divide by the size of the "
            "last dimension.", dict(use_sum=True), dict(use_sum=True, no_eps=True)),
    Mistake("you returned 1/RMS (rsqrt); the function should return the RMS itself.", dict(inverse=True)),
    Mistake("the mean was taken over the wrong dimension: RMS reduces the last (feature) dimension.", dict(dim=0),
            when=lambda c: c.x.dim() > 1),
    Mistake("the eps argument is ignored: use the eps that is passed, not 1e-6.",
            lambda c: _rms64(c.x, 1e-6), when=lambda c: c.eps != 1e-6),
    Mistake("the reduced dimension was dropped: keep it (keepdim=True) so the result broadcasts against x.",
            dict(keepdim=False)),
    Mistake(f"no float32 upcast: the squares were computed in float16, where {_HALF}. Convert with x.float() "
            "before squaring.", lambda c: (c.x.pow(2).mean(-1, keepdim=True) + c.eps).sqrt(),
            when=lambda c: c.x.dtype == torch.float16),
]


def _rms_case(x: torch.Tensor, eps: float | None, text: str) -> Case:
    e = 1e-6 if eps is None else eps
    return Case(f"rms on {text}", partial(_rms64, x, e), (x,) if eps is None else (x, eps), x=x, eps=e)


@exercise_check
def check_rms(run: CheckRun, rms) -> str:
    """``rms(x, eps=1e-6)``: sqrt(mean(x², last dim, keepdim) + eps), computed and returned in float32."""
    g = run.rng(0)
    public = [
        _rms_case(torch.randn(2, 3, 16, generator=g) * 2, None, "x of shape [2, 3, 16]"),
        _rms_case(torch.randn(5, 8, generator=g) * 1e-3, None, "x of shape [5, 8] with tiny magnitudes (|x| ≈ 1e-3, "
                                                               "where eps matters)"),
        _rms_case(torch.randn(1, 4, generator=g) * 1e-3, 1e-2, "x of shape [1, 4] with eps=1e-2 and |x| ≈ 1e-3"),
        _rms_case(torch.randn(32, generator=g), None, "a single vector x of shape [32]"),
    ]
    for dtype, scale in ((torch.float16, 400.0), (torch.float16, 1e-3), (torch.bfloat16, 1.0)):
        x = (torch.randn(4, 64, generator=g) * scale).to(dtype)
        public.append(_rms_case(x, None, f"{dtype_name(x)} x of shape [4, 64] with |x| ≈ {scale:g}"))

    def secret(g):
        n, d, eps = run.randint(g, 1, 6), 4 * run.randint(g, 1, 12), run.pick(g, [1e-6, 1e-5, 1e-3])
        return [_rms_case(torch.randn(n, d, generator=g) * 10 ** run.randint(g, -3, 2), eps,
                          f"x of shape [{n}, {d}] with eps={eps:g}")]

    for case in run.cases(public, secret, seed=100):
        got = run.call(case.text, rms, *case.args)
        half = case.x.dtype != torch.float32
        tolerance = dict(rtol=4e-3, atol=1e-4 * case.want.abs().max().item()) if half else {}
        run.judge(case, got, RMS_MISTAKES, hint="RMS(x) = sqrt(mean(x², last dim) + eps), computed in float32.",
                  **tolerance)
        run.require(getattr(got, "dtype", None) == torch.float32, case.text,
                    f"the values are right but the dtype is {dtype_name(got)}; return the float32 statistic "
                    "(x.float()...), as the exercise asks.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps"


# ---- exercise 2: the layer -------------------------------------------------------------------------------

NORM_MISTAKES = [
    Mistake("the mean was subtracted: that is LayerNorm. RMSNorm divides x itself by sqrt(mean(x²) + eps), with no "
            "centering.", dict(center=True)),
    Mistake("the mean was subtracted (torch.std / var, the unbiased version): that is LayerNorm-like. RMSNorm uses "
            "mean(x²) of the raw x.", dict(center=True, unbiased=True)),
    Mistake("x was divided by its standard deviation (x.std()): the mean is subtracted inside std. RMSNorm divides "
            "by sqrt(mean(x²) + eps).", lambda c: c.x.double() / c.x.double().std(-1, keepdim=True) * c.w.double()),
    Mistake("eps was added outside the square root: x / (sqrt(mean(x²)) + eps). It belongs inside: "
            "x / sqrt(mean(x²) + eps).", dict(eps_outside=True)),
    Mistake("eps is missing: with tiny vectors x / sqrt(mean(x²)) blows them up to unit size; add eps under the "
            "square root.", lambda c: rms_norm64(c.x, c.w, 0.0)),
    Mistake("the square root is missing: x was divided by the mean square, not by its root.", dict(no_sqrt=True)),
    Mistake("the sum of squares was used instead of the mean: divide by the number of features (mean, not sum).",
            dict(use_sum=True)),
    Mistake("x was multiplied by the RMS instead of divided by it (use torch.rsqrt, or divide by the sqrt).",
            dict(multiply=True)),
    Mistake("the learned scale self.weight is not applied: multiply the normalised x by self.weight.",
            lambda c: rms_norm64(c.x, None, c.eps)),
    Mistake("the scale was applied before normalising: weight·x was normalised, so the scale cancels out. "
            "Normalise x first, then multiply by self.weight.", lambda c: rms_norm64(c.x * c.w, None, c.eps)),
    Mistake("the mean was taken over the wrong dimension: normalise over the last (feature) dimension.", _wrong_dim),
    Mistake("the eps argument is ignored (1e-6 whatever was passed): store eps in __init__ (self.eps) and use it "
            "in forward.", lambda c: rms_norm64(c.x, c.w, 1e-6), when=lambda c: c.eps != 1e-6),
    Mistake("eps is 1e-5 whatever was passed: use the eps given to __init__ (default 1e-6).",
            lambda c: rms_norm64(c.x, c.w, 1e-5), when=lambda c: c.eps != 1e-5),
    Mistake(f"no float32 upcast: the statistics were computed in float16, where {_HALF}. Compute mean(x²) and the "
            "rsqrt in float32 (x.float()), then cast back with .type_as(x).",
            lambda c: c.x * torch.rsqrt(c.x.pow(2).mean(-1, keepdim=True) + c.eps) * c.w,
            when=lambda c: c.x.dtype == torch.float16),
]


def _norm_case(x, w, eps: float, text: str) -> Case:
    return Case(f"forward on {text}", partial(rms_norm64, x, w, eps), (x,), x=x, w=w, eps=eps)


@exercise_check
def check_rmsnorm(run: CheckRun, RMSNormClass) -> str:
    """``RMSNorm(d, eps=1e-6)`` with ``.weight`` (ones at init) and ``.eps``; float32 statistics, output in
    the input's dtype."""
    g = run.rng(1)
    m = run.call("RMSNorm(16)", RMSNormClass, 16)
    weight = getattr(m, "weight", None)
    if not isinstance(weight, nn.Parameter) or tuple(weight.shape) != (16,):
        run.fail("RMSNorm(16) needs a learned scale self.weight = nn.Parameter(torch.ones(16)) "
                 f"(got {type(weight).__name__} of shape {shape_of(weight)}).")
    extra = [k for k, _ in m.named_parameters() if k != "weight"]
    if extra:
        run.fail(f"RMSNorm has only one parameter, weight; yours also has {extra} (no bias: that would be "
                 "LayerNorm's shift).")
    init_ok, eps_ok = bool(torch.all(m.weight == 1)), getattr(m, "eps", None) == 1e-6
    w16 = 1.0 + 0.5 * torch.randn(16, generator=g)
    public = [_norm_case(torch.randn(2, 5, 16, generator=g) * 2, w16, 1e-6, "x of shape [2, 5, 16]"),
              _norm_case(torch.randn(3, 16, generator=g) * 1e-4, w16, 1e-6,
                         "x of shape [3, 16] with tiny magnitudes (|x| ≈ 1e-4, where eps dominates)"),
              _norm_case(torch.randn(4, 16, generator=g) * 0.1, w16, 1e-2, "x of shape [4, 16] and eps=1e-2"),
              _norm_case(torch.randn(1, 1, 16, generator=g), w16, 1e-6, "x of shape [1, 1, 16] (batch 1, one token)")]
    for dtype, scale in ((torch.float16, 400.0), (torch.float16, 1e-3), (torch.bfloat16, 1.0)):
        x, w = (torch.randn(4, 64, generator=g) * scale).to(dtype), (1.0 + 0.5 * torch.randn(64, generator=g))
        public.append(_norm_case(x, w.to(dtype), 1e-6, f"{dtype_name(x)} x of shape [4, 64] with |x| ≈ {scale:g}, "
                                                       f"module converted with .to({dtype_name(x)})"))

    def secret(g):
        d, eps = 8 * run.randint(g, 1, 8), run.pick(g, [1e-6, 1e-5, 1e-2])
        x = torch.randn(run.randint(g, 1, 4), run.randint(g, 1, 5), d, generator=g) * 10 ** run.randint(g, -3, 2)
        return [_norm_case(x, 1.0 + 0.5 * torch.randn(d, generator=g), eps,
                           f"x of shape {list(x.shape)} and eps={eps:g}")]

    for case in run.cases(public, secret, seed=101):
        d, dtype = case.x.shape[-1], case.x.dtype
        made = f"RMSNorm({d})" if case.eps == 1e-6 else f"RMSNorm({d}, eps={case.eps:g})"
        m = run.call(made, RMSNormClass, d) if case.eps == 1e-6 else run.call(made, RMSNormClass, d, case.eps)
        m.weight.copy_(case.w.float())
        if dtype != torch.float32:
            m = run.call(f"{made}.to({dtype_name(case.x)})", m.to, dtype)
        got = run.call(f"{case.text} (random weight)", m, case.x)
        half = dict(rtol=1e-2, atol=4e-3 * case.want.abs().max().item()) if dtype != torch.float32 else {}
        run.judge(case, got, NORM_MISTAKES, hint="RMSNorm(x) = x / sqrt(mean(x², last dim) + eps) · weight.", **half)
        run.require(getattr(got, "dtype", None) == dtype, case.text,
                    f"the values are right but the output dtype is {dtype_name(got)}; RMSNorm returns the input's "
                    "dtype (cast back with .type_as(x) before applying the scale).")
    run.require(init_ok, "RMSNorm(16)", "the formula is right, but self.weight should start as ones (torch.ones(d)) "
                                        "so a fresh RMSNorm only normalises.")
    run.require(eps_ok, "RMSNorm(16)", "the formula is right, but the default eps should be 1e-6 and be stored as "
                                       "self.eps.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps, random scale"
