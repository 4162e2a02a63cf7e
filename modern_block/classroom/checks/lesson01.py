"""Lesson 01: the root mean square and the RMSNorm layer."""

from __future__ import annotations

import torch
import torch.nn as nn

from .core import (
    call_student,
    dtype_name,
    exercise_check,
    fail,
    generator,
    judge,
    require_dtype,
    shape_of,
)
from .reference import rms_norm64

_RMS_HINT = "RMS(x) = sqrt(mean(x², last dim) + eps), computed in float32."


def _rms_candidates(x, eps, weight=None):
    """(diagnosis, output) pairs for the usual RMS/RMSNorm mistakes; weight=None: the bare statistic."""
    if weight is None:  # the statistic itself: sqrt(mean(x²) + eps)
        x64 = x.double()
        ms = x64.pow(2).mean(-1, keepdim=True)
        var = x64.var(-1, unbiased=False, keepdim=True)
        return [
            ("the mean was subtracted: that is the standard deviation (LayerNorm's statistic). RMS does not "
             "center x: sqrt(mean(x²) + eps).", lambda: (var + eps).sqrt()),
            ("the mean was subtracted (torch.std / var): RMS uses mean(x²) of the raw x, no centering.",
             lambda: (x64.var(-1, unbiased=True, keepdim=True) + eps).sqrt()),
            ("the mean was subtracted (torch.std / var): RMS uses mean(x²) of the raw x, no centering.",
             lambda: x64.std(-1, keepdim=True)),
            ("eps was added outside the square root: sqrt(mean(x²)) + eps. It belongs inside: "
             "sqrt(mean(x²) + eps).", lambda: ms.sqrt() + eps),
            ("eps is missing: sqrt(mean(x²) + eps) keeps tiny vectors from dividing by ~0.", lambda: ms.sqrt()),
            ("the square root is missing: that is the mean square, not its root.", lambda: ms + eps),
            ("the sum of squares was used instead of the mean: divide by the size of the last dimension.",
             lambda: (x64.pow(2).sum(-1, keepdim=True) + eps).sqrt()),
            ("the sum of squares was used instead of the mean (x.norm() is sqrt(sum(x²))).",
             lambda: x64.norm(dim=-1, keepdim=True)),
            ("you returned 1/RMS (rsqrt); the function should return the RMS itself.",
             lambda: (ms + eps).rsqrt()),
            ("the mean was taken over the wrong dimension: RMSNorm reduces the last (feature) dimension.",
             lambda: (x64.pow(2).mean(0, keepdim=True) + eps).sqrt() if x.dim() > 1 else None),
        ]
    w = weight.double()
    cands = [
        ("the mean was subtracted: that is LayerNorm. RMSNorm divides x itself by sqrt(mean(x²) + eps), "
         "with no centering.", lambda: rms_norm64(x, w, eps, center=True)),
        ("the mean was subtracted (torch.std / var, the unbiased version): that is LayerNorm-like. RMSNorm "
         "uses mean(x²) of the raw x.", lambda: rms_norm64(x, w, eps, center=True, unbiased=True)),
        ("x was divided by its standard deviation (x.std()): the mean is subtracted inside std. RMSNorm divides "
         "by sqrt(mean(x²) + eps).", lambda: x.double() / x.double().std(-1, keepdim=True) * w),
        ("eps was added outside the square root: x / (sqrt(mean(x²)) + eps). It belongs inside: "
         "x / sqrt(mean(x²) + eps).", lambda: rms_norm64(x, w, eps, eps_outside=True)),
        ("eps is missing: with tiny vectors x / sqrt(mean(x²)) blows them up to unit size; add eps under the "
         "square root.", lambda: rms_norm64(x, w, 0.0)),
        ("the square root is missing: x was divided by the mean square, not by its root.",
         lambda: rms_norm64(x, w, eps, no_sqrt=True)),
        ("the sum of squares was used instead of the mean: divide by the number of features (mean, not sum).",
         lambda: rms_norm64(x, w, eps, use_sum=True)),
        ("x was multiplied by the RMS instead of divided by it (use torch.rsqrt, or divide by the sqrt).",
         lambda: rms_norm64(x, w, eps, multiply=True)),
        ("the learned scale self.weight is not applied: multiply the normalised x by self.weight.",
         lambda: rms_norm64(x, None, eps)),
        ("the scale was applied before normalising: weight·x was normalised, so the scale cancels out. "
         "Normalise x first, then multiply by self.weight.", lambda: rms_norm64(x * w, None, eps)),
        ("the mean was taken over the wrong dimension: normalise over the last (feature) dimension.",
         lambda: rms_norm64(x, w, eps, dim=0) if x.dim() > 1 and x.shape[0] > 1 else None),
        ("the mean was taken over the wrong dimension: normalise over the last (feature) dimension.",
         lambda: rms_norm64(x, w, eps, dim=-2) if x.dim() > 2 else None),
    ]
    if eps != 1e-6:
        cands.append((f"the eps argument is ignored: this RMSNorm was built with eps={eps:g} but you used 1e-6. "
                      "Store eps in __init__ (self.eps) and use it in forward.",
                      lambda: rms_norm64(x, w, 1e-6)))
    if eps != 1e-5:
        cands.append(("eps is 1e-5 whatever was passed: use the eps given to __init__ (default 1e-6).",
                      lambda: rms_norm64(x, w, 1e-5)))
    return cands


@exercise_check(components=("RMSNorm",))
def check_rms(rms) -> str:
    """``rms(x, eps=1e-6)``: sqrt(mean(x², last dim, keepdim) + eps), computed and returned in float32."""
    __tracebackhide__ = True
    name = "check_rms"
    g = generator(0)
    cases = [  # (description, x, eps or None for the default)
        ("x of shape [2, 3, 16]", torch.randn(2, 3, 16, generator=g) * 2, None),
        ("x of shape [5, 8] with tiny magnitudes (|x| ≈ 1e-3, where eps matters)",
         torch.randn(5, 8, generator=g) * 1e-3, None),
        ("x of shape [1, 4] with eps=1e-2 and |x| ≈ 1e-3", torch.randn(1, 4, generator=g) * 1e-3, 1e-2),
        ("a single vector x of shape [32]", torch.randn(32, generator=g), None),
    ]
    for desc, x, eps in cases:
        e = 1e-6 if eps is None else eps
        got = call_student(name, f"rms on {desc}", rms, x.clone(), *(() if eps is None else (eps,)))
        want = (x.double().pow(2).mean(-1, keepdim=True) + e).sqrt()
        cands = _rms_candidates(x, e)
        if eps is not None:
            cands.append(("the eps argument is ignored: use the eps that is passed (here 1e-2), not 1e-6.",
                          (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()))
        cands.append(("the reduced dimension was dropped: keep it (keepdim=True) so the result broadcasts "
                      "against x.", want.squeeze(-1)))  # the same words as in the half-precision cases below
        judge(name, got, want, cands, f"on {desc}", hint=_RMS_HINT)
        require_dtype(name, got, torch.float32, f"on {desc}", "the dtype", "return float32.")
    # half precision: the statistic must be computed in float32
    for dtype, scale, why in ((torch.float16, 400.0, "x² overflows float16 above 65,504, i.e. for |x| > 256"),
                              (torch.float16, 1e-3, "x² underflows float16 (below 6e-8) for |x| < 2.4e-4"),
                              (torch.bfloat16, 1.0, "bfloat16 keeps only 8 bits of mantissa")):
        x = (torch.randn(4, 64, generator=g) * scale).to(dtype)
        desc = f"{dtype_name(x)} x of shape [4, 64] with |x| ≈ {scale:g}"
        got = call_student(name, f"rms on {desc}", rms, x.clone())
        want = (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        native = (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        upcast = (f"no float32 upcast: the squares were computed in {dtype_name(x)}, where {why}. Convert with "
                  "x.float() before squaring.")
        keepdim = ("the reduced dimension was dropped: keep it (keepdim=True) so the result broadcasts "
                   "against x.", want.squeeze(-1))
        told = [(upcast, native)] if dtype == torch.float16 else []  # in bfloat16 only the dtype tells
        judge(name, got, want, told + [keepdim] + _rms_candidates(x, 1e-6), f"on {desc}",
              rtol=4e-3, atol=1e-4 * want.abs().max().item(), hint=upcast if dtype == torch.float16 else "")
        require_dtype(name, got, torch.float32, f"on {desc}", "the dtype",
                      "return the float32 statistic (x.float()...), as the exercise asks.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps"


@exercise_check(components=("RMSNorm",))
def check_rmsnorm(RMSNormClass) -> str:
    """``RMSNorm(d, eps=1e-6)`` with ``.weight`` (ones at init) and ``.eps``; float32 statistics, output in
    the input's dtype."""
    __tracebackhide__ = True
    name = "check_rmsnorm"
    g = generator(1)
    d = 16
    m = call_student(name, "RMSNorm(16)", RMSNormClass, d)
    if not isinstance(getattr(m, "weight", None), nn.Parameter) or tuple(m.weight.shape) != (d,):
        weight = getattr(m, "weight", None)
        fail(name, "RMSNorm(16) needs a learned scale self.weight = nn.Parameter(torch.ones(16)) "
                   f"(got {type(weight).__name__} of shape {shape_of(weight)}).")
    extra = [k for k, _ in m.named_parameters() if k != "weight"]
    if extra:
        fail(name, f"RMSNorm has only one parameter, weight; yours also has {extra} (no bias: "
                   "that would be LayerNorm's shift).")
    init_ok = bool(torch.all(m.weight == 1))
    cases = [
        ("x of shape [2, 5, 16]", torch.randn(2, 5, d, generator=g) * 2, 1e-6),
        ("x of shape [3, 16] with tiny magnitudes (|x| ≈ 1e-4, where eps dominates)",
         torch.randn(3, d, generator=g) * 1e-4, 1e-6),
        ("x of shape [4, 16] and RMSNorm(16, eps=1e-2)", torch.randn(4, d, generator=g) * 0.1, 1e-2),
        ("x of shape [1, 1, 16] (batch 1, one token)", torch.randn(1, 1, d, generator=g), 1e-6),
    ]
    weight = 1.0 + 0.5 * torch.randn(d, generator=g)
    for desc, x, eps in cases:
        m = call_student(name, f"RMSNorm({d}, eps={eps:g})", RMSNormClass, d, eps) if eps != 1e-6 else \
            call_student(name, f"RMSNorm({d})", RMSNormClass, d)
        m.weight.copy_(weight)
        got = call_student(name, f"forward on {desc}", m, x.clone())
        want = rms_norm64(x, weight, eps)
        judge(name, got, want, _rms_candidates(x, eps, weight), f"on {desc} (random weight)",
              hint="RMSNorm(x) = x / sqrt(mean(x², last dim) + eps) · weight.")
    for dtype, scale, why in ((torch.float16, 400.0, "x² overflows float16 above 65,504 (|x| > 256): "
                               "the statistic becomes inf and the output 0"),
                              (torch.float16, 1e-3, "the squares of |x| ≈ 1e-3 fall into float16's subnormal "
                               "range and lose most of their digits"),
                              (torch.bfloat16, 1.0, "bfloat16 keeps only 8 bits of mantissa")):
        x = (torch.randn(4, 64, generator=g) * scale).to(dtype)
        desc = f"{dtype_name(x)} x of shape [4, 64] with |x| ≈ {scale:g}, module converted with .to({dtype_name(x)})"
        m = call_student(name, "RMSNorm(64)", RMSNormClass, 64)
        w = (1.0 + 0.5 * torch.randn(64, generator=g)).to(dtype)
        m.weight.copy_(w)
        m = call_student(name, f"RMSNorm(64).to({dtype_name(x)})", m.to, dtype)
        got = call_student(name, f"forward on {desc}", m, x.clone())
        want = rms_norm64(x, w, 1e-6)
        native = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        upcast = (f"no float32 upcast: the statistics were computed in {dtype_name(x)}, where {why}. Compute "
                  "mean(x²) and the rsqrt in float32 (x.float()), then cast back with .type_as(x).")
        judge(name, got, want, [(upcast, native)] + _rms_candidates(x, 1e-6, w), f"on {desc}",
              rtol=1e-2, atol=4e-3 * want.abs().max().item(), hint=upcast if dtype == torch.float16 else "")
        require_dtype(name, got, dtype, f"on {desc}", "the output dtype", "RMSNorm returns the input's dtype "
                      "(cast back with .type_as(x) before applying the scale).")
    if not init_ok:
        fail(name, "the formula is right, but self.weight should start as ones (torch.ones(d)) so a fresh "
                   "RMSNorm only normalises.")
    if getattr(call_student(name, "RMSNorm(16)", RMSNormClass, d), "eps", None) != 1e-6:
        fail(name, "the formula is right, but the default eps should be 1e-6 and be stored as self.eps.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps, random scale"
