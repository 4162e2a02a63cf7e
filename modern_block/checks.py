"""Checks for the exercise notebooks: does the student's code agree with the package, and if not, why?

Each ``check_*`` takes the student's function or class, runs it next to the package's reference
implementation on several inputs (shapes, batch 1 and > 1, float32 / float16 / bfloat16, tiny
magnitudes, long positions, one KV head ...) and

* prints one line ``✓ check_x passed (...)`` when everything agrees;
* raises ``NotAttempted`` when the code still raises ``NotImplementedError`` (the exercise stub);
* raises ``CheckFailed`` with a diagnosis otherwise.

A diagnosis names the likely mathematical mistake: the check computes the outputs of the common
wrong formulas itself (LayerNorm's mean subtraction, eps outside the square root, the other RoPE
layout, tiled KV heads, no causal mask, ...) and reports the one the student's output matches.
The formula is judged first, on float32 inputs; only then come precision (fp32 upcast), dtype and
shape complaints, so a secondary problem never hides a wrong formula.

Both exceptions subclass ``AssertionError``; the grader (``modern_block.grade``) tells them apart.
Every check runs in well under a second on a CPU and leaves the global random state untouched.
"""

from __future__ import annotations

import functools
import itertools
import math
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import GQAttention
from .ffn import SwiGLU, swiglu_hidden_dim
from .kv_cache import mla_cache_bytes_per_token
from .llama import Block, LlamaStyleLM
from .params import count_parameters
from .rmsnorm import RMSNorm
from .rope import rope_cache

__all__ = [
    "CheckFailed", "NotAttempted",
    "check_rms", "check_rmsnorm",
    "check_swiglu_hidden_dim", "check_swiglu", "check_ffn_weight_count",
    "check_rope_cache", "check_apply_rope", "check_apply_rope_interleaved",
    "check_repeat_kv", "check_gqattention", "check_kv_cache",
    "check_mla_cache_bytes", "check_absorb_query", "check_absorbed_scores", "check_mla_absorption",
    "check_qk_norm_rope", "check_qk_norm_attention",
    "check_block", "check_llama_lm", "check_llama_param_count",
]


class NotAttempted(AssertionError):
    """The code under test still raises ``NotImplementedError``: the exercise has not been done yet."""


class CheckFailed(AssertionError):
    """The code runs but disagrees with the reference; the message says what is likely wrong."""


# ---- machinery ---------------------------------------------------------------------------------------


def _check(fn):
    """Run a check with a private random state, without autograd, turning a stub's
    NotImplementedError into NotAttempted, and print the success line."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        __tracebackhide__ = True
        name = fn.__name__
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # the tensors are tiny: one thread is fastest, and immune to a busy machine
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                torch.manual_seed(1234)
                summary = fn(*args, **kwargs)
        except NotImplementedError as err:
            hint = f" (the stub says: {err})" if str(err) else ""
            raise NotAttempted(f"{name}: not implemented yet{hint}") from None
        finally:
            torch.set_num_threads(threads)
        print(f"✓ {name} passed ({summary})")

    return wrapper


def _fail(name: str, message: str):
    __tracebackhide__ = True
    raise CheckFailed(f"{name}: {message}")


def _call(name: str, what: str, fn, *args, **kwargs):
    """Call the student's code; a crash becomes a CheckFailed that says which call crashed."""
    __tracebackhide__ = True
    try:
        return fn(*args, **kwargs)
    except (NotImplementedError, NotAttempted, CheckFailed):
        raise
    except Exception as err:  # the student's code crashed: say where, keep the traceback chained
        raise CheckFailed(f"{name}: {what} raised {type(err).__name__}: {err}") from err


def _shape(t) -> str:
    return str(list(t.shape)) if isinstance(t, torch.Tensor) else type(t).__name__


def _dt(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _require_dtype(name: str, got: torch.Tensor, dtype: torch.dtype, where: str, what: str, advice: str):
    """After the values have passed: fail, saying so, when ``got`` has another dtype than ``dtype``."""
    __tracebackhide__ = True
    if got.dtype != dtype:
        _fail(name, f"{where}: the values are right but {what} is {_dt(got)}; {advice}")


def _close(got, want: torch.Tensor, rtol: float, atol: float) -> bool:
    """Same shape and allclose in float64 (NaN/inf in ``got`` never pass)."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return False
    g, w = got.detach().double(), want.detach().double()
    return bool(torch.isfinite(g).all()) and torch.allclose(g, w, rtol=rtol, atol=atol)


def _max_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().double() - want.detach().double()).abs().max().item()


def _judge(name: str, got, want: torch.Tensor, candidates, case: str, *, rtol: float = 1e-4,
           atol: float = 1e-5, hint: str = "") -> None:
    """Return if ``got`` matches ``want``. Otherwise raise CheckFailed naming the first candidate
    mistake whose output ``got`` matches; candidates are (diagnosis, tensor or zero-arg callable)."""
    __tracebackhide__ = True
    if not isinstance(got, torch.Tensor):
        _fail(name, f"{case}: expected a tensor, got {type(got).__name__}.")
    if _close(got, want, rtol, atol):
        return
    for diagnosis, make in candidates:
        wrong = make() if callable(make) else make
        if wrong is not None and _close(got, wrong, rtol, atol):
            effect = (f"it differs from the correct output by up to {_max_diff(wrong, want):.3g}"
                      if wrong.shape == want.shape else f"its shape is {_shape(wrong)} instead of {_shape(want)}")
            _fail(name, f"{case}.\nLikely mistake: {diagnosis}\n(Your output equals what that mistake computes; "
                        f"{effect}.)")
    if got.shape != want.shape:
        if got.numel() == want.numel() and _close(got.reshape(want.shape), want, rtol, atol):
            _fail(name, f"{case}: the numbers are right but the shape is {_shape(got)}, expected {_shape(want)}.")
        _fail(name, f"{case}: output shape {_shape(got)}, expected {_shape(want)}. {hint}".rstrip())
    if not torch.isfinite(got.detach()).all() and torch.isfinite(want).all():
        _fail(name, f"{case}: your output contains inf or NaN where the correct output is finite. {hint}".rstrip())
    _fail(name, f"{case}: your output differs from the correct one by up to {_max_diff(got, want):.3g} "
                f"(tolerance {atol:g} + {rtol:g}·|value|), and matches none of the common mistakes this check "
                f"knows. {hint}".rstrip())


def _judge_int(name: str, got, want: int, candidates, case: str, hint: str = "") -> None:
    """The integer version of ``_judge``: the value first, its type after."""
    __tracebackhide__ = True
    value = got.item() if isinstance(got, torch.Tensor) and got.numel() == 1 else got
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        _fail(name, f"{case}: expected an int, got {type(got).__name__} {got!r}.")
    if value != want:
        for diagnosis, wrong in candidates:
            if wrong is not None and wrong != want and value == wrong:
                _fail(name, f"{case}: got {value:,}, expected {want:,}.\nLikely mistake: {diagnosis}")
        _fail(name, f"{case}: got {value:,}, expected {want:,}. {hint}".rstrip())
    if type(got) is not int:
        _fail(name, f"{case}: the value is right but it is a {type(got).__name__}; return a plain int "
                    f"(wrap it in int(...)).")


def _randomize(module: nn.Module, seed: int) -> nn.Module:
    """Reference weights with structure: random Linear/Embedding weights and norm scales that are
    far from 1 and differ per feature (so a forgotten or misplaced scale shows)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("norm.weight") or name == "weight" and p.dim() == 1:
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
        else:
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in if p.dim() > 1 else 1))
    return module


_KEY_HINTS = (
    (".bias", "Llama-style layers have no biases: use nn.Linear(..., bias=False) (and RMSNorm, which has no bias, "
              "rather than LayerNorm)."),
)


def _load(name: str, student: nn.Module, ref: nn.Module, hints: dict[str, str] | None = None) -> None:
    """Copy the reference's weights into the student's module, explaining any naming or shape mismatch."""
    __tracebackhide__ = True
    if not isinstance(student, nn.Module):
        _fail(name, f"expected an nn.Module, got {type(student).__name__}.")
    want = ref.state_dict()
    have = student.state_dict()
    problems = []
    for key in want:
        if key not in have:
            problems.append(f"missing {key} (shape {list(want[key].shape)})")
        elif have[key].shape != want[key].shape:
            problems.append(f"{key} has shape {list(have[key].shape)}, expected {list(want[key].shape)}")
    for key in have:
        if key not in want:
            problems.append(f"unexpected {key} (shape {list(have[key].shape)})")
    if problems:
        advice = []
        for key_part, text in list((hints or {}).items()) + list(_KEY_HINTS):
            if any(key_part in p for p in problems) and text not in advice:
                advice.append(text)
        _fail(name, "your module's parameters do not match the reference layout, so its weights cannot be "
                    "loaded:\n  " + "\n  ".join(problems) + ("\n" + " ".join(advice) if advice else ""))
    student.load_state_dict(want)


# ---- reference formulas in float64 (the candidates are variations of these) ---------------------------


def _rms_norm64(x, weight, eps, *, center=False, eps_outside=False, use_sum=False, no_sqrt=False,
                multiply=False, dim=-1, unbiased=False):
    x = x.double()
    if center:
        x = x - x.mean(dim, keepdim=True)
    ms = x.pow(2).sum(dim, keepdim=True) if use_sum else x.pow(2).mean(dim, keepdim=True)
    if unbiased:
        ms = ms * x.shape[dim] / (x.shape[dim] - 1)
    if no_sqrt:
        denom = ms + eps
    elif eps_outside:
        denom = ms.sqrt() + eps
    else:
        denom = (ms + eps).sqrt()
    y = x * denom if multiply else x / denom
    return y if weight is None else y * weight.double()


def _rope64(x, cos, sin, layout="half", sign=1.0, swap_halves=False, swap_tables=False):
    """RoPE in float64 with knobs: layout half/interleaved, rotation sign, output halves swapped,
    cos and sin swapped."""
    x, cos, sin = x.double(), cos.double(), sin.double()
    if swap_tables:
        cos, sin = sin, cos
    sin = sign * sin
    if layout == "half":
        x1, x2 = x.chunk(2, dim=-1)
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        return torch.cat([b, a] if swap_halves else [a, b], dim=-1)
    if layout == "interleaved":
        x1, x2 = x[..., 0::2], x[..., 1::2]
        a, b = x1 * cos - x2 * sin, x1 * sin + x2 * cos
        if swap_halves:  # results written back half-split instead of re-interleaved
            return torch.cat([a, b], dim=-1)
        return torch.stack([a, b], dim=-1).flatten(-2)
    if layout == "none":
        return x
    if layout == "cos_only":
        return x * torch.cat([cos, cos], dim=-1)
    raise ValueError(layout)


# ---- lesson 01: RMSNorm ------------------------------------------------------------------------------

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
         "with no centering.", lambda: _rms_norm64(x, w, eps, center=True)),
        ("the mean was subtracted (torch.std / var, the unbiased version): that is LayerNorm-like. RMSNorm "
         "uses mean(x²) of the raw x.", lambda: _rms_norm64(x, w, eps, center=True, unbiased=True)),
        ("x was divided by its standard deviation (x.std()): the mean is subtracted inside std. RMSNorm divides "
         "by sqrt(mean(x²) + eps).", lambda: x.double() / x.double().std(-1, keepdim=True) * w),
        ("eps was added outside the square root: x / (sqrt(mean(x²)) + eps). It belongs inside: "
         "x / sqrt(mean(x²) + eps).", lambda: _rms_norm64(x, w, eps, eps_outside=True)),
        ("eps is missing: with tiny vectors x / sqrt(mean(x²)) blows them up to unit size; add eps under the "
         "square root.", lambda: _rms_norm64(x, w, 0.0)),
        ("the square root is missing: x was divided by the mean square, not by its root.",
         lambda: _rms_norm64(x, w, eps, no_sqrt=True)),
        ("the sum of squares was used instead of the mean: divide by the number of features (mean, not sum).",
         lambda: _rms_norm64(x, w, eps, use_sum=True)),
        ("x was multiplied by the RMS instead of divided by it (use torch.rsqrt, or divide by the sqrt).",
         lambda: _rms_norm64(x, w, eps, multiply=True)),
        ("the learned scale self.weight is not applied: multiply the normalised x by self.weight.",
         lambda: _rms_norm64(x, None, eps)),
        ("the scale was applied before normalising: weight·x was normalised, so the scale cancels out. "
         "Normalise x first, then multiply by self.weight.", lambda: _rms_norm64(x * w, None, eps)),
        ("the mean was taken over the wrong dimension: normalise over the last (feature) dimension.",
         lambda: _rms_norm64(x, w, eps, dim=0) if x.dim() > 1 and x.shape[0] > 1 else None),
        ("the mean was taken over the wrong dimension: normalise over the last (feature) dimension.",
         lambda: _rms_norm64(x, w, eps, dim=-2) if x.dim() > 2 else None),
    ]
    if eps != 1e-6:
        cands.append((f"the eps argument is ignored: this RMSNorm was built with eps={eps:g} but you used 1e-6. "
                      "Store eps in __init__ (self.eps) and use it in forward.",
                      lambda: _rms_norm64(x, w, 1e-6)))
    if eps != 1e-5:
        cands.append(("eps is 1e-5 whatever was passed: use the eps given to __init__ (default 1e-6).",
                      lambda: _rms_norm64(x, w, 1e-5)))
    return cands


@_check
def check_rms(rms) -> str:
    """``rms(x, eps=1e-6)``: sqrt(mean(x², last dim, keepdim) + eps), computed and returned in float32."""
    __tracebackhide__ = True
    name = "check_rms"
    g = torch.Generator().manual_seed(0)
    cases = [  # (description, x, eps or None for the default)
        ("x of shape [2, 3, 16]", torch.randn(2, 3, 16, generator=g) * 2, None),
        ("x of shape [5, 8] with tiny magnitudes (|x| ≈ 1e-3, where eps matters)",
         torch.randn(5, 8, generator=g) * 1e-3, None),
        ("x of shape [1, 4] with eps=1e-2", torch.randn(1, 4, generator=g) * 0.1, 1e-2),
        ("a single vector x of shape [32]", torch.randn(32, generator=g), None),
    ]
    for desc, x, eps in cases:
        e = 1e-6 if eps is None else eps
        got = _call(name, f"rms on {desc}", rms, x.clone(), *(() if eps is None else (eps,)))
        want = (x.double().pow(2).mean(-1, keepdim=True) + e).sqrt()
        cands = _rms_candidates(x, e)
        if eps is not None:
            cands.append(("the eps argument is ignored: use the eps that is passed (here 1e-2), not 1e-6.",
                          (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()))
        cands.append(("the reduced dimension was dropped: keep it (keepdim=True) so the result broadcasts "
                      "against x.", want.squeeze(-1)))
        _judge(name, got, want, cands, f"on {desc}", hint=_RMS_HINT)
        _require_dtype(name, got, torch.float32, f"on {desc}", "the dtype", "return float32.")
    # half precision: the statistic must be computed in float32
    for dtype, scale, why in ((torch.float16, 400.0, "x² overflows float16 above 65,504, i.e. for |x| > 256"),
                              (torch.float16, 1e-3, "x² underflows float16 (below 6e-8) for |x| < 2.4e-4"),
                              (torch.bfloat16, 1.0, "bfloat16 keeps only 8 bits of mantissa")):
        x = (torch.randn(4, 64, generator=g) * scale).to(dtype)
        desc = f"{_dt(x)} x of shape [4, 64] with |x| ≈ {scale:g}"
        got = _call(name, f"rms on {desc}", rms, x.clone())
        want = (x.double().pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        native = (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
        upcast = (f"no float32 upcast: the squares were computed in {_dt(x)}, where {why}. Convert with "
                  "x.float() before squaring.")
        _judge(name, got, want, [(upcast, native)] + _rms_candidates(x, 1e-6), f"on {desc}",
               rtol=4e-3, atol=1e-4 * want.abs().max().item(), hint=upcast if dtype == torch.float16 else "")
        _require_dtype(name, got, torch.float32, f"on {desc}", "the dtype",
                       "return the float32 statistic (x.float()...), as the exercise asks.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps"


@_check
def check_rmsnorm(RMSNormClass) -> str:
    """``RMSNorm(d, eps=1e-6)`` with ``.weight`` (ones at init) and ``.eps``; float32 statistics, output in
    the input's dtype."""
    __tracebackhide__ = True
    name = "check_rmsnorm"
    g = torch.Generator().manual_seed(1)
    d = 16
    m = _call(name, "RMSNorm(16)", RMSNormClass, d)
    if not isinstance(getattr(m, "weight", None), nn.Parameter) or tuple(m.weight.shape) != (d,):
        _fail(name, "RMSNorm(16) needs a learned scale self.weight = nn.Parameter(torch.ones(16)) "
                    f"(got {type(getattr(m, 'weight', None)).__name__} of shape {_shape(getattr(m, 'weight', None))}).")
    extra = [k for k, _ in m.named_parameters() if k != "weight"]
    if extra:
        _fail(name, f"RMSNorm has only one parameter, weight; yours also has {extra} (no bias: "
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
        m = _call(name, f"RMSNorm({d}, eps={eps:g})", RMSNormClass, d, eps) if eps != 1e-6 else \
            _call(name, f"RMSNorm({d})", RMSNormClass, d)
        m.weight.copy_(weight)
        got = _call(name, f"forward on {desc}", m, x.clone())
        want = _rms_norm64(x, weight, eps)
        _judge(name, got, want, _rms_candidates(x, eps, weight), f"on {desc} (random weight)",
               hint="RMSNorm(x) = x / sqrt(mean(x², last dim) + eps) · weight.")
    for dtype, scale, why in ((torch.float16, 400.0, "x² overflows float16 above 65,504 (|x| > 256): "
                               "the statistic becomes inf and the output 0"),
                              (torch.float16, 1e-3, "the squares of |x| ≈ 1e-3 fall into float16's subnormal "
                               "range and lose most of their digits"),
                              (torch.bfloat16, 1.0, "bfloat16 keeps only 8 bits of mantissa")):
        x = (torch.randn(4, 64, generator=g) * scale).to(dtype)
        desc = f"{_dt(x)} x of shape [4, 64] with |x| ≈ {scale:g}, module converted with .to({_dt(x)})"
        m = _call(name, "RMSNorm(64)", RMSNormClass, 64)
        w = (1.0 + 0.5 * torch.randn(64, generator=g)).to(dtype)
        m.weight.copy_(w)
        m = _call(name, f"RMSNorm(64).to({_dt(x)})", m.to, dtype)
        got = _call(name, f"forward on {desc}", m, x.clone())
        want = _rms_norm64(x, w, 1e-6)
        native = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        upcast = (f"no float32 upcast: the statistics were computed in {_dt(x)}, where {why}. Compute "
                  "mean(x²) and the rsqrt in float32 (x.float()), then cast back with .type_as(x).")
        _judge(name, got, want, [(upcast, native)] + _rms_candidates(x, 1e-6, w), f"on {desc}",
               rtol=1e-2, atol=4e-3 * want.abs().max().item(), hint=upcast if dtype == torch.float16 else "")
        _require_dtype(name, got, dtype, f"on {desc}", "the output dtype", "RMSNorm returns the input's dtype "
                       "(cast back with .type_as(x) before applying the scale).")
    if not init_ok:
        _fail(name, "the formula is right, but self.weight should start as ones (torch.ones(d)) so a fresh "
                    "RMSNorm only normalises.")
    if getattr(_call(name, "RMSNorm(16)", RMSNormClass, d), "eps", None) != 1e-6:
        _fail(name, "the formula is right, but the default eps should be 1e-6 and be stored as self.eps.")
    return "7 cases: float32 / float16 / bfloat16, tiny magnitudes, custom eps, random scale"


# ---- lesson 02: SwiGLU -------------------------------------------------------------------------------


def _hidden_candidates(d, multiple_of, mult):
    """Wrong versions of Llama's hidden-size rule, each as (diagnosis, value)."""
    def up(h):
        return multiple_of * math.ceil(h / multiple_of)

    base = int(2 * (4 * d) / 3)
    h = int(mult * base) if mult is not None else base
    c = [
        ("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.", up(4 * d)),
        ("used GPT-2's d_ff = 4d. SwiGLU has three matrices, so parameter matching gives 8/3·d.", 4 * d),
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


@_check
def check_swiglu_hidden_dim(swiglu_hidden_dim_fn) -> str:
    """``swiglu_hidden_dim(d, multiple_of=256, ffn_dim_multiplier=None)``: Llama's rule."""
    __tracebackhide__ = True
    name = "check_swiglu_hidden_dim"
    cases = [(4096, None, None), (5120, None, None), (4096, 1024, 1.3), (256, 16, None), (1000, None, None),
             (4096, 1, None), (768, 64, None), (100, 8, 1.5), (7, 1, None)]
    for d, m, mult in cases:
        args = (d,) if m is None else (d, m) if mult is None else (d, m, mult)
        call = f"swiglu_hidden_dim({', '.join(map(str, args))})"
        got = _call(name, call, swiglu_hidden_dim_fn, *args)
        want = swiglu_hidden_dim(d, m or 256, mult)
        _judge_int(name, got, want, _hidden_candidates(d, m or 256, mult), call,
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


@_check
def check_swiglu(SwiGLUClass) -> str:
    """``SwiGLU(d, d_ff)`` with bias-free ``w_gate``, ``w_up`` (d → d_ff) and ``w_down`` (d_ff → d)."""
    __tracebackhide__ = True
    name = "check_swiglu"
    d, d_ff = 16, 40
    ref = _randomize(SwiGLU(d, d_ff), 2)
    student = _call(name, f"SwiGLU({d}, {d_ff})", SwiGLUClass, d, d_ff)
    _load(name, student, ref, {"w_gate": "Name the layers w_gate, w_up (d → d_ff) and w_down (d_ff → d).",
                               "w_down": "w_down maps d_ff back to d: nn.Linear(d_ff, d, bias=False)."})
    wg, wu, wd = ref.w_gate.weight, ref.w_up.weight, ref.w_down.weight
    g = torch.Generator().manual_seed(3)
    cases = [("x of shape [2, 5, 16]", torch.randn(2, 5, d, generator=g)),
             ("x of shape [1, 1, 16]", torch.randn(1, 1, d, generator=g)),
             ("x of shape [3, 16] (no batch dimension)", torch.randn(3, d, generator=g) * 3)]
    for desc, x in cases:
        got = _call(name, f"forward on {desc}", student, x.clone())
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
        _judge(name, got, want, cands, f"on {desc}", hint="SwiGLU(x) = w_down(silu(w_gate(x)) * w_up(x)).")
    x = torch.randn(2, 4, d, generator=g).to(torch.bfloat16)
    m = _call(name, "module.to(torch.bfloat16)", student.to, torch.bfloat16)
    got = _call(name, "forward on a bfloat16 x of shape [2, 4, 16]", m, x)
    ref_bf = ref.to(torch.bfloat16)
    _judge(name, got, _swiglu64(x, ref_bf.w_gate.weight, ref_bf.w_up.weight, ref_bf.w_down.weight), [],
           "on a bfloat16 x of shape [2, 4, 16]", rtol=3e-2, atol=3e-2)
    if got.dtype != torch.bfloat16:
        _fail(name, f"a bfloat16 input gave a {_dt(got)} output; keep the input's dtype.")
    return "4 cases: 3-D and 2-D inputs, batch 1, bfloat16"


@_check
def check_ffn_weight_count(ffn_weight_count) -> str:
    """``ffn_weight_count(d, d_ff, gated)``: weights of a bias-free FFN: 2·d·d_ff (GELU MLP) or
    3·d·d_ff (SwiGLU)."""
    __tracebackhide__ = True
    name = "check_ffn_weight_count"
    cases = [(4096, 16384, False), (4096, 11008, True), (5120, 13824, True), (64, 256, False), (64, 170, True)]
    for d, d_ff, gated in cases:
        call = f"ffn_weight_count({d}, {d_ff}, gated={gated})"
        got = _call(name, call, ffn_weight_count, d, d_ff, gated)
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
        _judge_int(name, got, want, cands, call, hint="GELU MLP: 2·d·d_ff; SwiGLU: 3·d·d_ff (no biases).")
    return "5 cases incl. 8d² = 134,217,728 and Llama's 135,266,304"


# ---- lesson 03: RoPE ---------------------------------------------------------------------------------


def _rope_tables64(T, dh, base, *, exponent="2i/dh", positions_from=0, full=None):
    i = torch.arange(dh // 2, dtype=torch.float64)
    if exponent == "2i/dh":
        theta = base ** (-2 * i / dh)
    elif exponent == "i/dh":
        theta = base ** (-i / dh)
    elif exponent == "4i/dh":
        theta = base ** (-4 * i / dh)
    elif exponent == "+2i/dh":
        theta = base ** (2 * i / dh)
    elif exponent == "linspace":
        theta = base ** (-torch.linspace(0, 1, dh // 2, dtype=torch.float64))
    elif exponent == "per_dim":
        theta = base ** (-torch.arange(dh, dtype=torch.float64) / dh)
    else:
        raise ValueError(exponent)
    ang = torch.outer(torch.arange(positions_from, positions_from + T, dtype=torch.float64), theta)
    if full == "cat":
        ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


@_check
def check_rope_cache(rope_cache_fn) -> str:
    """``rope_cache(T, dh, base=10000.0)`` → ``(cos, sin)``, each float32 of shape [T, dh/2], angle
    m·θ_i with θ_i = base^(-2i/dh)."""
    __tracebackhide__ = True
    name = "check_rope_cache"
    cases = [(8, 4, None), (16, 8, None), (64, 16, 500000.0), (4096, 64, None), (1, 2, None)]
    for T, dh, base in cases:
        b = 10000.0 if base is None else base
        call = f"rope_cache({T}, {dh}" + ("" if base is None else f", base={base:g}") + ")"
        out = _call(name, call, rope_cache_fn, T, dh, *(() if base is None else (base,)))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            _fail(name, f"{call} must return a pair (cos, sin), got {type(out).__name__}.")
        cos, sin = out
        want_cos, want_sin = _rope_tables64(T, dh, b)
        # float32 angles near position 4096 carry ~2.4e-4 rad of rounding: allow for it there
        atol = 2e-3 if T > 1000 else 2e-5
        mistakes = [
            ("the exponent is i/dh; it is 2i/dh (θ_i = base^(-2i/dh) for pair i = 0 .. dh/2-1).",
             dict(exponent="i/dh")),
            ("the exponent counts 2i twice: with i from torch.arange(0, dh, 2) (already even numbers), "
             "use base^(-i/dh), not base^(-2i/dh).", dict(exponent="4i/dh")),
            ("the exponent has the wrong sign: θ_i = base^(-2i/dh) starts at 1 rad/token and decreases.",
             dict(exponent="+2i/dh")),
            ("the exponents run from 0 to 1 (linspace); they are 2i/dh for i < dh/2, so the last is 1 - 2/dh.",
             dict(exponent="linspace")),
            ("positions start at 1; the first token is at position 0 (cos = 1, sin = 0 there).",
             dict(positions_from=1)),
            ("one angle per dimension (dh columns); RoPE has one angle per pair: dh/2 columns.",
             dict(exponent="per_dim")),
            ("the tables were duplicated to dh columns (Hugging Face's layout); here cos and sin have one "
             "column per pair, shape [T, dh/2].", dict(full="cat")),
        ]
        if b != 10000.0:
            mistakes.append((f"the base argument is ignored: use base (here {b:g}) in θ_i = base^(-2i/dh).",
                             dict(base=10000.0)))
        for which, got, want in (("cos", cos, want_cos), ("sin", sin, want_sin)):
            k = 0 if which == "cos" else 1
            cands = [("cos and sin were returned in the wrong order: return (cos, sin).",
                      (want_sin, want_cos)[k])]
            for diag, kw in mistakes:
                kw = dict(kw)
                bb = kw.pop("base", b)
                cands.append((diag, _rope_tables64(T, dh, bb, **kw)[k]))
            if isinstance(got, torch.Tensor) and got.shape == want.shape[::-1] and T > 1:
                _fail(name, f"{call}: {which} has shape {_shape(got)}; it should be [T, dh/2] = {list(want.shape)} "
                            "(positions along the rows).")
            _judge(name, got, want, cands, f"{call}, {which}", atol=atol, rtol=0,
                   hint="angle[m, i] = m·base^(-2i/dh), m = 0 .. T-1, i = 0 .. dh/2-1.")
        for which, got in (("cos", cos), ("sin", sin)):
            _require_dtype(name, got, torch.float32, call, which, "return float32 tables.")
    return "5 cases incl. base 500,000 and positions up to 4,095"


def _rope_cases(g):
    """(description, x, cos, sin) cases shared by the two RoPE-application checks."""
    cos8, sin8 = rope_cache(6, 8)
    cos16, sin16 = rope_cache(4096, 16)
    cos2, sin2 = rope_cache(8, 2)
    return [
        ("x of shape [1, 2, 6, 8] at positions 0..5", torch.randn(1, 2, 6, 8, generator=g), cos8, sin8),
        ("x of shape [2, 3, 4, 16] at positions 4090..4093 (long positions)",
         torch.randn(2, 3, 4, 16, generator=g), cos16[4090:4094], sin16[4090:4094]),
        ("x of shape [1, 1, 1, 2] at position 7 (one pair)", torch.randn(1, 1, 1, 2, generator=g),
         cos2[7:8], sin2[7:8]),
    ]


def _check_rope_fn(name, fn, layout) -> str:
    __tracebackhide__ = True
    other = "interleaved" if layout == "half" else "half"
    g = torch.Generator().manual_seed(4)
    layouts = {"half": "half-split (pair i with i + dh/2: x1, x2 = x.chunk(2, -1))",
               "interleaved": "interleaved (pair 2i with 2i+1: x[..., 0::2], x[..., 1::2])"}
    for desc, x, cos, sin in _rope_cases(g):
        x_before = x.clone()
        got = _call(name, f"{name[6:]} on {desc}", fn, x, cos, sin)
        if not torch.equal(x, x_before):
            _fail(name, f"on {desc}: your function changed x in place; return a new tensor.")
        want = _rope64(x, cos, sin, layout)
        mk = partial(_rope64, x, cos, sin)
        cands = [
            (f"the other RoPE layout: you rotated {layouts[other]}; this function uses {layouts[layout]}.",
             partial(mk, other)),
            ("rotation in the wrong direction (sin has the wrong sign): rotate (a, b) to "
             "(a·cos - b·sin, a·sin + b·cos).", partial(mk, layout, sign=-1.0)),
            (f"the other layout and the wrong direction: use {layouts[layout]} and (a·cos - b·sin, a·sin + b·cos).",
             partial(mk, other, sign=-1.0)),
            ("cos and sin were swapped.", partial(mk, layout, swap_tables=True)),
            ("the two halves of the result were swapped: return cat([x1·cos - x2·sin, x1·sin + x2·cos])."
             if layout == "half" else
             "the rotated pairs were written back half-split (cat) instead of re-interleaved: "
             "torch.stack([a, b], dim=-1).flatten(-2).", partial(mk, layout, swap_halves=True)),
            ("only x·cos: the rotate-half term (sin) is missing.", partial(mk, "cos_only")),
            ("x is returned unrotated.", partial(mk, "none")),
        ]
        _judge(name, got, want, cands, f"on {desc}", hint=f"layout: {layouts[layout]}.")
    x = torch.randn(2, 2, 5, 8, generator=g).to(torch.bfloat16)
    cos, sin = rope_cache(5, 8)
    desc = "a bfloat16 x of shape [2, 2, 5, 8] with float32 tables"
    got = _call(name, f"{name[6:]} on {desc}", fn, x, cos, sin)
    _judge(name, got, _rope64(x, cos.to(torch.bfloat16), sin.to(torch.bfloat16), layout), [], f"on {desc}",
           rtol=2e-2, atol=2e-2)
    _require_dtype(name, got, x.dtype, f"on {desc}", "the output",
                   "keep x's dtype (cast cos and sin to x.dtype first).")
    return "4 cases: batch 1 and 2, positions up to 4,093, one pair, bfloat16"


@_check
def check_apply_rope(apply_rope_fn) -> str:
    """``apply_rope(x, cos, sin)``: half-split layout; x [B, heads, T, dh], tables [T, dh/2]."""
    __tracebackhide__ = True
    return _check_rope_fn("check_apply_rope", apply_rope_fn, "half")


@_check
def check_apply_rope_interleaved(apply_rope_interleaved_fn) -> str:
    """``apply_rope_interleaved(x, cos, sin)``: pairs (2i, 2i+1); same shapes as apply_rope."""
    __tracebackhide__ = True
    return _check_rope_fn("check_apply_rope_interleaved", apply_rope_interleaved_fn, "interleaved")


# ---- lesson 04: GQA and the KV cache ------------------------------------------------------------------


@_check
def check_repeat_kv(repeat_kv) -> str:
    """``repeat_kv(k, n_rep)``: [B, n_kv, T, dh] → [B, n_kv·n_rep, T, dh], query head j reading KV head
    j // n_rep (grouped)."""
    __tracebackhide__ = True
    name = "check_repeat_kv"
    g = torch.Generator().manual_seed(5)
    cases = [(torch.randn(2, 2, 3, 4, generator=g), 3), (torch.randn(1, 1, 5, 4, generator=g), 4),
             (torch.randn(2, 3, 2, 4, generator=g), 1), (torch.randn(1, 4, 1, 2, generator=g), 2)]
    for k, n_rep in cases:
        desc = f"k of shape {_shape(k)}, n_rep={n_rep}"
        got = _call(name, f"repeat_kv on {desc}", repeat_kv, k.clone(), n_rep)
        want = k.repeat_interleave(n_rep, dim=1)
        cands = [
            ("KV heads tiled (k.repeat) instead of grouped (repeat_interleave): query head j must read KV head "
             "j // n_rep, so copies of one KV head sit next to each other (0,0,1,1), not (0,1,0,1).",
             k.repeat(1, n_rep, 1, 1)),
            ("repeated along the sequence (dim 2) instead of the head dimension (dim 1).",
             k.repeat_interleave(n_rep, dim=2)),
            ("repeated along the head size (last dim) instead of the head dimension (dim 1).",
             k.repeat_interleave(n_rep, dim=-1)),
        ]
        _judge(name, got, want, cands, f"on {desc}", rtol=0, atol=0,
               hint="k.repeat_interleave(n_rep, dim=1), or k[:, :, None].expand(...).reshape(...).")
    return "4 cases: GQA, MQA (one KV head), n_rep = 1"


def _attention64(p, x, cos, sin, *, h, kv, dh, eps, qk_norm, group="grouped", mask="causal", scale="dh",
                 rope="qk", layout="half", sign=1.0, norm="before", split="ok", merge="ok", softmax_dim=-1):
    """GQA attention in float64 from the weights ``p``, with one knob per common mistake."""
    B, T, d = x.shape
    x = x.double()

    def heads(t, n):
        if split == "ok":
            return t.view(B, T, n, dh).transpose(1, 2)
        return t.reshape(B, n, T, dh)  # wrong: mixes tokens and features

    q, k, v = heads(x @ p["wq"].T, h), heads(x @ p["wk"].T, kv), heads(x @ p["wv"].T, kv)

    def rms(t, w):
        return _rms_norm64(t, w, eps)

    rot = partial(_rope64, cos=cos, sin=sin, layout=layout, sign=sign)
    if qk_norm and norm == "swap":
        q, k = rms(q, p["k_norm"]), rms(k, p["q_norm"])
    elif qk_norm and norm == "before":
        q, k = rms(q, p["q_norm"]), rms(k, p["k_norm"])
    elif qk_norm and norm == "q_only":
        q = rms(q, p["q_norm"])
    elif qk_norm and norm == "k_only":
        k = rms(k, p["k_norm"])
    if rope in ("qk", "qkv", "q"):
        q = rot(q)
    if rope in ("qk", "qkv", "k"):
        k = rot(k)
    if rope == "qkv":
        v = rot(v)
    if qk_norm and norm == "after":
        q, k = rms(q, p["q_norm"]), rms(k, p["k_norm"])
    rep = h // kv
    if group == "grouped":
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    else:
        k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
    s = q @ k.transpose(-1, -2)
    s = s * {"dh": dh ** -0.5, "head_dim_lin": 1.0 / dh, "none": 1.0, "d": d ** -0.5}[scale]
    if mask != "none":
        keep = torch.ones(T, T, dtype=torch.bool).tril()
        if mask == "anti":
            keep = keep.T
        s = s.masked_fill(~keep, float("-inf"))
    a = s.softmax(softmax_dim).nan_to_num(0.0)
    o = a @ v  # [B, h, T, dh]
    o = o.transpose(1, 2).reshape(B, T, h * dh) if merge == "ok" else o.reshape(B, T, h * dh)
    return o @ p["wo"].T


_ATTENTION_MISTAKES = [  # (diagnosis, knobs, applies(h, kv, qk_norm))
    ("KV heads tiled instead of grouped: query head j must read KV head j // (n_heads / n_kv_heads). Use "
     "repeat_interleave(n_rep, dim=1) (or enable_gqa=True), not repeat / expand over a new leading dim.",
     dict(group="tiled"), lambda h, kv, qn: 1 < kv < h),
    ("no causal mask: each token also attends to later tokens. Use is_causal=True, or fill the scores above "
     "the diagonal with -inf before the softmax.", dict(mask="none"), lambda h, kv, qn: True),
    ("the causal mask is upside down: it hides the past and shows the future (tril/triu mixed up).",
     dict(mask="anti"), lambda h, kv, qn: True),
    ("wrong softmax scale: the scores were divided by head_dim; divide by sqrt(head_dim).",
     dict(scale="head_dim_lin"), lambda h, kv, qn: True),
    ("no softmax scale: divide the scores q·k by sqrt(head_dim).", dict(scale="none"), lambda h, kv, qn: True),
    ("wrong softmax scale: 1/sqrt(d) uses the model width; use 1/sqrt(head_dim).", dict(scale="d"),
     lambda h, kv, qn: True),
    ("RoPE is not applied: rotate q and k with apply_rope(q, cos, sin), apply_rope(k, cos, sin).",
     dict(rope="none"), lambda h, kv, qn: True),
    ("RoPE was applied to q only; rotate k too.", dict(rope="q"), lambda h, kv, qn: True),
    ("RoPE was applied to k only; rotate q too.", dict(rope="k"), lambda h, kv, qn: True),
    ("RoPE was applied to the values too; it rotates q and k only (positions enter through the scores).",
     dict(rope="qkv"), lambda h, kv, qn: True),
    ("the interleaved RoPE layout; these models use the half-split layout of apply_rope.",
     dict(layout="interleaved"), lambda h, kv, qn: True),
    ("RoPE rotates in the wrong direction (the sign of sin).", dict(sign=-1.0), lambda h, kv, qn: True),
    ("QK-norm after RoPE: normalise q and k first (self.q_norm, self.k_norm), then rotate them.",
     dict(norm="after"), lambda h, kv, qn: qn),
    ("QK-norm is missing: apply self.q_norm to q and self.k_norm to k (per head, before RoPE).",
     dict(norm="none"), lambda h, kv, qn: qn),
    ("q_norm and k_norm were swapped: q goes through self.q_norm, k through self.k_norm.",
     dict(norm="swap"), lambda h, kv, qn: qn),
    ("QK-norm on q only: k needs self.k_norm too.", dict(norm="q_only"), lambda h, kv, qn: qn),
    ("QK-norm on k only: q needs self.q_norm too.", dict(norm="k_only"), lambda h, kv, qn: qn),
    ("the heads were split with view(B, n_heads, T, head_dim), which mixes tokens and features; use "
     "view(B, T, n_heads, head_dim).transpose(1, 2).", dict(split="bad"), lambda h, kv, qn: True),
    ("the heads were merged without transposing back: out.transpose(1, 2).reshape(B, T, n_heads·head_dim).",
     dict(merge="bad"), lambda h, kv, qn: h > 1),
    ("softmax over the wrong axis (over queries); normalise each query's scores over the keys (last dim).",
     dict(softmax_dim=-2), lambda h, kv, qn: True),
]


def _attention_params(ref: GQAttention) -> dict:
    p = {k: ref.get_submodule(k).weight.detach().double() for k in ("wq", "wk", "wv", "wo")}
    for k in ("q_norm", "k_norm"):
        mod = ref.get_submodule(k)
        p[k] = mod.weight.detach().double() if isinstance(mod, RMSNorm) else None
    return p


def _judge_attention(name, got, ref, x, cos, sin, qk_norm, desc, extra=()):
    """Compare an attention output with the reference; if it differs, try every single mistake, then every
    pair of mistakes, and report the one that explains it."""
    __tracebackhide__ = True
    h, kv, dh = ref.h, ref.kv, ref.dh
    eps = ref.q_norm.eps if qk_norm else 1e-6
    p = _attention_params(ref)
    run = partial(_attention64, p, x, cos, sin, h=h, kv=kv, dh=dh, eps=eps, qk_norm=qk_norm)
    want = run()
    mistakes = [(diag, knobs) for diag, knobs, ok in _ATTENTION_MISTAKES if ok(h, kv, qk_norm)]
    cands = list(extra) + [(diag, partial(run, **knobs)) for diag, knobs in mistakes]
    try:
        _judge(name, got, want, cands, desc, atol=2e-5, rtol=1e-4)
    except CheckFailed as first:
        if "Likely mistake" in str(first) or not isinstance(got, torch.Tensor) or got.shape != want.shape:
            raise
        for (d1, k1), (d2, k2) in itertools.combinations(mistakes, 2):
            if set(k1) & set(k2):
                continue
            if _close(got, run(**k1, **k2), 1e-4, 2e-5):
                _fail(name, f"{desc}.\nLikely mistakes (two at once): {d1}\nand: {d2}")
        first_ok = _close(got[:, :1], want[:, :1], 1e-4, 2e-5)
        if first_ok and got.shape[1] > 1:
            _fail(name, f"{str(first).split(': ', 1)[1]}\nThe first token's output is right, the later ones are "
                        "not: look at what later tokens see (mask, grouping of KV heads, positions).")
        raise


def _attention_cases(g):
    """(description, d, n_heads, n_kv_heads, qk_norm, B, T, position offset)."""
    return [
        ("GQA with 4 query heads over 2 KV heads, x of shape [2, 6, 32]", 32, 4, 2, True, 2, 6, 0),
        ("MQA (one KV head), x of shape [1, 5, 32]", 32, 4, 1, False, 1, 5, 0),
        ("MHA (3 KV heads for 3 heads), x of shape [2, 4, 24]", 24, 3, 3, True, 2, 4, 0),
        ("GQA 8 over 2, x of shape [2, 9, 64] at positions 100..108", 64, 8, 2, False, 2, 9, 100),
        ("GQA 4 over 2, one token (T = 1), x of shape [2, 1, 32]", 32, 4, 2, True, 2, 1, 0),
    ]


def _check_attention_module(name, make_student, qk_norm_cases=None, load_hints=None):
    __tracebackhide__ = True
    g = torch.Generator().manual_seed(6)
    n = 0
    for desc, d, h, kv, qk_norm, B, T, offset in _attention_cases(g):
        if qk_norm_cases is not None:
            qk_norm = qk_norm_cases
        else:
            desc += f", qk_norm={qk_norm}"
        ref = _randomize(GQAttention(d, h, kv, qk_norm=qk_norm), 10 + n)
        student = make_student(d, h, kv, qk_norm)
        _load(name, student, ref, load_hints)
        x = torch.randn(B, T, d, generator=g)
        cos, sin = rope_cache(offset + T, d // h)
        cos, sin = cos[offset:], sin[offset:]
        got = _call(name, f"forward(x, cos, sin) with {desc}", student, x.clone(), cos, sin)
        extra = []
        if offset:
            c0, s0 = rope_cache(T, d // h)
            p = _attention_params(ref)
            extra.append(("your forward ignores the cos/sin it is given (it rotates as if the tokens were at "
                          "positions 0..T-1): use the tables passed to forward.",
                          lambda p=p, c0=c0, s0=s0, ref=ref, x=x, qk_norm=qk_norm: _attention64(
                              p, x, c0, s0, h=ref.h, kv=ref.kv, dh=ref.dh, eps=1e-6, qk_norm=qk_norm)))
        _judge_attention(name, got, ref, x, cos, sin, qk_norm, f"with {desc}", extra)
        n += 1
    # bfloat16 weights and inputs
    ref = _randomize(GQAttention(32, 4, 2, qk_norm=qk_norm_cases if qk_norm_cases is not None else True), 30)
    student = make_student(32, 4, 2, qk_norm_cases if qk_norm_cases is not None else True)
    _load(name, student, ref, load_hints)
    student = _call(name, "module.to(torch.bfloat16)", student.to, torch.bfloat16)
    ref = ref.to(torch.bfloat16)
    x = torch.randn(2, 5, 32, generator=g).to(torch.bfloat16)
    cos, sin = rope_cache(5, 8)
    got = _call(name, "forward on a bfloat16 x of shape [2, 5, 32]", student, x, cos, sin)
    want = ref(x, cos, sin)
    _judge(name, got, want, [], "on a bfloat16 x of shape [2, 5, 32] (module in bfloat16)", rtol=5e-2,
           atol=5e-2 * want.abs().max().item())
    if got.dtype != torch.bfloat16:
        _fail(name, f"a bfloat16 module and input gave a {_dt(got)} output; keep the input's dtype "
                    "(cast the RoPE tables to x.dtype).")
    qk = "QK-norm on/off" if qk_norm_cases is None else "random QK-norm scales"
    return f"{n + 1} cases: GQA, MQA, MHA, {qk}, batch 1 and 2, T = 1, positions from 100, bfloat16"


_GQA_LOAD_HINTS = {
    "wk.weight": "wk and wv project to n_kv_heads·head_dim features (fewer K/V heads than query heads).",
    "wv.weight": "wk and wv project to n_kv_heads·head_dim features (fewer K/V heads than query heads).",
    "q_norm": "With qk_norm=True: self.q_norm = RMSNorm(head_dim) and self.k_norm = RMSNorm(head_dim) (per head, "
              "not over d); with qk_norm=False use nn.Identity().",
    "wq": "Name the projections wq, wk, wv (d → heads·head_dim) and wo (n_heads·head_dim → d), all bias-free.",
}


@_check
def check_gqattention(GQAttentionClass) -> str:
    """``GQAttention(d, n_heads, n_kv_heads, qk_norm=True)`` with wq/wk/wv/wo/q_norm/k_norm and
    ``forward(x, cos, sin)``, causal."""
    __tracebackhide__ = True
    name = "check_gqattention"

    def make(d, h, kv, qk_norm):
        return _call(name, f"GQAttention({d}, {h}, {kv}, qk_norm={qk_norm})", GQAttentionClass, d, h, kv,
                     qk_norm=qk_norm)

    return _check_attention_module(name, make, load_hints=_GQA_LOAD_HINTS)


def _decode64(ref: GQAttention, x, cos, sin, schedule, *, positions="offset", cache="rotated",
              chunk_mask="offset", prefill_mask=True, use_cache=True, update=True, group="grouped"):
    """Emulate chunked decoding with a KV cache in float64, with knobs for the common mistakes.
    Returns the outputs of all chunks concatenated along T."""
    p = _attention_params(ref)
    h, kv, dh = ref.h, ref.kv, ref.dh
    eps = ref.q_norm.eps if p["q_norm"] is not None else 1e-6
    B = x.shape[0]
    x = x.double()
    keys, vals, raw_keys = [], [], []
    outs = []
    start = 0
    for T in schedule:
        xt = x[:, start:start + T]
        q = (xt @ p["wq"].T).view(B, T, h, dh).transpose(1, 2)
        k = (xt @ p["wk"].T).view(B, T, kv, dh).transpose(1, 2)
        v = (xt @ p["wv"].T).view(B, T, kv, dh).transpose(1, 2)
        if p["q_norm"] is not None:
            q, k = _rms_norm64(q, p["q_norm"], eps), _rms_norm64(k, p["k_norm"], eps)
        cached = sum(t.shape[2] for t in keys)
        if positions != "offset":
            pos = 0
        elif not use_cache:  # the cache is kept (so the offset is known) but not attended to
            pos = start
        else:
            pos = cached
        c, s = cos[pos:pos + T], sin[pos:pos + T]
        q = _rope64(q, c, s)
        k_rot = _rope64(k, c, s)
        if not use_cache:
            K, V = k_rot, v
        else:
            if cache == "rotated":
                K = torch.cat(keys + [k_rot], dim=2)
            else:  # cache holds raw keys, rotated all together at the current positions
                Kraw = torch.cat(raw_keys + [k], dim=2)
                S = Kraw.shape[2]
                K = _rope64(Kraw, cos[pos:pos + 1].expand(S, -1), sin[pos:pos + 1].expand(S, -1)) \
                    if T == 1 else _rope64(Kraw, cos[:S], sin[:S])
            V = torch.cat(vals + [v], dim=2)
            if update:
                keys.append(k_rot)
                raw_keys.append(k)
                vals.append(v)
            elif not keys:  # only the prefill was ever stored
                keys.append(k_rot)
                raw_keys.append(k)
                vals.append(v)
        S = K.shape[2]
        rep = h // kv
        if group == "grouped":
            K, V = K.repeat_interleave(rep, 1), V.repeat_interleave(rep, 1)
        else:
            K, V = K.repeat(1, rep, 1, 1), V.repeat(1, rep, 1, 1)
        scores = q @ K.transpose(-1, -2) * dh ** -0.5  # [B, h, T, S]
        offset = S - T
        if T > 1 or chunk_mask == "topleft":
            if offset == 0:
                keep = torch.ones(T, S, dtype=torch.bool).tril() if prefill_mask else None
            elif chunk_mask == "offset":
                keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=offset)
            elif chunk_mask == "topleft":
                keep = torch.ones(T, S, dtype=torch.bool).tril()
            else:
                keep = None
            if keep is not None:
                scores = scores.masked_fill(~keep, float("-inf"))
        o = scores.softmax(-1) @ V
        outs.append(o.transpose(1, 2).reshape(B, T, h * dh) @ p["wo"].T)
        start += T
    return torch.cat(outs, dim=1)


@_check
def check_kv_cache(attend_cached) -> str:
    """``attend_cached(attn, x, cos, sin, cache)``: attention of the new tokens x [B, T, d] (which follow
    the cached ones) through the package's GQAttention ``attn``; ``cache`` is a dict with "k" and "v"
    (None when empty, else [B, n_kv, past, dh]) that the function extends; cos/sin are the full tables."""
    __tracebackhide__ = True
    name = "check_kv_cache"
    g = torch.Generator().manual_seed(7)
    configs = [  # (description, d, h, kv, qk_norm, B, schedule)
        ("GQA 4 over 2 heads, batch 2, prefill 3 tokens then 1, 1, a chunk of 2, then 1", 32, 4, 2, False, 2,
         [3, 1, 1, 2, 1]),
        ("MQA (one KV head), batch 1, QK-norm on, one token at a time", 32, 4, 1, True, 1, [1, 1, 1, 1]),
        ("MHA (2 over 2), batch 2, prefill 4, then a chunk of 3", 16, 2, 2, False, 2, [4, 3]),
    ]
    for desc, d, h, kv, qk_norm, B, schedule in configs:
        ref = _randomize(GQAttention(d, h, kv, qk_norm=qk_norm), 40 + d + h + kv)
        total = sum(schedule)
        x = torch.randn(B, total, d, generator=g)
        cos, sin = rope_cache(total + 4, d // h)
        cache = {"k": None, "v": None}
        outs = []
        start = 0
        for step, T in enumerate(schedule):
            out = _call(name, f"attend_cached (step {step}, {T} new token{'s' * (T > 1)}) with {desc}",
                        attend_cached, ref, x[:, start:start + T].clone(), cos, sin, cache)
            if not isinstance(out, torch.Tensor) or out.shape != (B, T, d):
                _fail(name, f"step {step} with {desc}: the output has shape {_shape(out)}, expected {[B, T, d]}.")
            outs.append(out)
            start += T
        got = torch.cat(outs, dim=1)
        want = _decode64(ref, x, cos, sin, schedule)
        run = partial(_decode64, ref, x, cos, sin, schedule)
        cands = [
            ("the new tokens were rotated as if they started at position 0: their positions are past .. past+T-1, "
             "where past is the number of cached tokens (slice cos[past:past+T]).", partial(run, positions="zero")),
            ("the cache is not used, or never filled: the new tokens attend only to themselves. Store the K/V in "
             "the dict you are given (cache['k'] = ..., in place, not a new dict), and attend over the cached and "
             "the new ones together.", partial(run, use_cache=False)),
            ("the cache is not updated after the first call: store the extended K/V back into cache['k'] and "
             "cache['v'].", partial(run, update=False)),
            ("the cache holds keys before RoPE and all of them were rotated at the new token's position: cache "
             "the rotated keys (each rotated once, at its own position).", partial(run, cache="raw")),
            ("is_causal=True with cached keys: PyTorch aligns that mask to the top-left corner, so new query i "
             "sees only keys 0..i. Query i is at position past+i and must see keys 0..past+i (use a mask "
             "tril(diagonal=past), or no mask for a single new token).", partial(run, chunk_mask="topleft")),
            ("no causal mask inside a chunk of several new tokens after a prefix: query i must not see the "
             "chunk's later tokens (mask = ones(T, S).tril(diagonal=past)).", partial(run, chunk_mask="none")),
            ("no causal mask, not even in the prefill.", partial(run, chunk_mask="none", prefill_mask=False)),
            ("KV heads tiled instead of grouped: repeat_interleave(n_heads // n_kv_heads, dim=1), not repeat.",
             partial(run, group="tiled")),
        ]
        _judge(name, got, want, cands, f"with {desc}, the outputs of all steps", atol=2e-5, rtol=1e-4,
               hint="Each step's output must equal the matching rows of attn(all tokens so far).")
        # what is cached: the n_kv rotated keys and the values, for every token so far
        k, v = cache.get("k"), cache.get("v")
        if not isinstance(k, torch.Tensor) or not isinstance(v, torch.Tensor):
            _fail(name, f"with {desc}: after the last step cache['k'] and cache['v'] must be tensors, got "
                        f"{type(k).__name__} and {type(v).__name__}.")
        if k.shape == (B, h, total, d // h) and kv < h:
            _fail(name, f"with {desc}: your outputs are right, but the cache holds {h} heads: it stores K/V after "
                        f"repeating them for every query head, {h // kv}× the memory. Cache the {kv} KV heads and "
                        "share them at attention time.")
        if k.shape != (B, kv, total, d // h) or v.shape != (B, kv, total, d // h):
            _fail(name, f"with {desc}: after {total} tokens the cache should hold k and v of shape "
                        f"{[B, kv, total, d // h]}, got {_shape(k)} and {_shape(v)}.")
        p = _attention_params(ref)
        kk = (x.double() @ p["wk"].T).view(B, total, kv, d // h).transpose(1, 2)
        if p["k_norm"] is not None:
            kk = _rms_norm64(kk, p["k_norm"], ref.k_norm.eps)
        k_rot = _rope64(kk, cos[:total], sin[:total])
        if not _close(k, k_rot, 1e-4, 2e-5):
            if _close(k, kk, 1e-4, 2e-5):
                _fail(name, f"with {desc}: your outputs are right, but cache['k'] holds the keys before RoPE, so "
                            "every step has to rotate the whole cache again. Store the rotated keys.")
            _fail(name, f"with {desc}: cache['k'] does not hold the keys (after k_norm and RoPE) of the tokens so "
                        "far, in order.")
        vv = (x.double() @ p["wv"].T).view(B, total, kv, d // h).transpose(1, 2)
        if not _close(v, vv, 1e-4, 2e-5):
            _fail(name, f"with {desc}: cache['v'] does not hold the values of the tokens so far, in order.")
    return "3 decoding schedules: GQA, MQA, MHA; prefill, single tokens and chunks; cache contents"


# ---- lesson 05: MLA ----------------------------------------------------------------------------------


@_check
def check_mla_cache_bytes(mla_cache_bytes) -> str:
    """``mla_cache_bytes(n_layers, kv_latent_dim, rope_dim, bytes_per_elem=2)``: bytes per token."""
    __tracebackhide__ = True
    name = "check_mla_cache_bytes"
    cases = [(61, 512, 64, 2), (61, 512, 64, 1), (4, 32, 8, 4), (1, 16, 2, 2)]
    for L, dc, dr, b in cases:
        call = f"mla_cache_bytes({L}, {dc}, {dr}, {b})"
        got = _call(name, call, mla_cache_bytes, L, dc, dr, b)
        want = mla_cache_bytes_per_token(L, dc, dr, b)
        cands = [
            ("counted two tensors (like K and V): MLA caches one latent c (d_c) and one shared RoPE key (d_R) "
             "per layer, nothing per head.", 2 * want),
            ("the decoupled RoPE key was forgotten: each layer caches d_c + d_R numbers.", L * dc * b),
            ("the latent was forgotten: each layer caches d_c + d_R numbers.", L * dr * b),
            ("the layers were not counted: every layer has its own cache.", (dc + dr) * b),
            ("bytes_per_elem was ignored: multiply the number of elements by it.", L * (dc + dr)),
            ("bits instead of bytes: multiply by bytes_per_elem, not by 8·bytes.", 8 * want),
        ]
        _judge_int(name, got, want, cands, call, hint="n_layers · (kv_latent_dim + rope_dim) · bytes_per_elem.")
    return "4 cases incl. DeepSeek-V3's 70,272 bytes per token"


def _mla_inputs(g, B, h, T, S, d_nope, d_c, d_r, d_v):
    return dict(
        q_nope=torch.randn(B, h, T, d_nope, generator=g), q_rope=torch.randn(B, h, T, d_r, generator=g),
        latent=torch.randn(B, S, d_c, generator=g), k_rope=torch.randn(B, S, d_r, generator=g),
        w_uk=torch.randn(h, d_nope, d_c, generator=g) / math.sqrt(d_c),
        w_uv=torch.randn(h, d_v, d_c, generator=g) / math.sqrt(d_c))


_MLA_CASES = [  # (description, B, h, T, S, d_nope, d_c, d_R, d_v)
    ("d_nope = d_c = 6, d_v = d_c (square per-head matrices), batch 2, 3 heads", 2, 3, 4, 4, 6, 6, 4, 6),
    ("d_nope = 4, d_c = 10, d_R = 2, d_v = 5, batch 1, 2 heads", 1, 2, 3, 5, 4, 10, 2, 5),
    ("one head, one new token over 7 cached latents", 2, 1, 1, 7, 8, 12, 4, 6),
]


def _mla_naive64(i, scale, *, rope=True, nope=True, mask="offset", w_uk_t=False, w_uv_t=False, scale_mode="given",
                 softmax_dim=-1, no_uv=False):
    """Scores and outputs the long way: rebuild every head's keys and values from the latents."""
    qn, qr, c, kr = (i[k].double() for k in ("q_nope", "q_rope", "latent", "k_rope"))
    w_uk, w_uv = i["w_uk"].double(), i["w_uv"].double()
    if w_uk_t:
        w_uk = w_uk.transpose(1, 2)
    if w_uv_t:
        w_uv = w_uv.transpose(1, 2)
    k_nope = torch.einsum("bsc,hnc->bhsn", c, w_uk)  # [B, h, S, d_nope]
    v = torch.einsum("bsc,hvc->bhsv", c, w_uv)  # [B, h, S, d_v]
    if no_uv:  # the weighted sum of latents, never mapped to values
        v = c.unsqueeze(1).expand(-1, w_uv.shape[0], -1, -1)
    s = 0
    if nope:
        s = s + qn @ k_nope.transpose(-1, -2)
    if rope:
        s = s + qr @ kr.unsqueeze(1).transpose(-1, -2)
    sc = {"given": scale, "none": 1.0, "twice": scale * scale,
          "nope": qn.shape[-1] ** -0.5, "latent": c.shape[-1] ** -0.5}[scale_mode]
    s = s * sc
    T, S = qn.shape[2], c.shape[1]
    if mask == "offset":
        keep = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
    elif mask == "topleft":
        keep = torch.ones(T, S, dtype=torch.bool).tril()
    else:
        keep = None
    return s, v, keep, softmax_dim


def _mla_out64(s, v, keep, softmax_dim):
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s.softmax(softmax_dim).nan_to_num(0.0) @ v


@_check
def check_absorb_query(absorb_query) -> str:
    """``absorb_query(q_nope, w_uk)``: q_nope [B, h, T, d_nope], w_uk [h, d_nope, d_c] (head m's W_UK,m) →
    [B, h, T, d_c] = W_UK,mᵀ q per head, so that (W_UK,mᵀ q)·c = q·(W_UK,m c)."""
    __tracebackhide__ = True
    name = "check_absorb_query"
    g = torch.Generator().manual_seed(8)
    for desc, B, h, T, S, dn, dc, dr, dv in _MLA_CASES:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        got = _call(name, f"absorb_query with {desc}", absorb_query, i["q_nope"].clone(), i["w_uk"].clone())
        qn, w = i["q_nope"].double(), i["w_uk"].double()
        want = torch.einsum("bhtn,hnc->bhtc", qn, w)
        cands = [
            ("multiplied by W_UK,m instead of its transpose: the key is k = W_UK,m c, so q·k = (W_UK,mᵀ q)·c; "
             "contract q with the d_nope axis of w_uk.", torch.einsum("bhtn,hcn->bhtc", qn, w) if dn == dc else None),
            ("every head used head 0's matrix: each head m has its own W_UK,m = w_uk[m].",
             torch.einsum("bhtn,nc->bhtc", qn, w[0])),
            ("the heads were summed: keep one latent query per head, [B, h, T, d_c].",
             torch.einsum("bhtn,hnc->btc", qn, w).unsqueeze(1).expand(-1, h, -1, -1)),
        ]
        _judge(name, got, want, cands, f"with {desc}", hint="q_latent[b, m, t] = w_uk[m]ᵀ @ q_nope[b, m, t].")
        # the property the absorption rests on, stated in the learner's terms
        lhs = got.double() @ i["latent"].double().transpose(-1, -2).unsqueeze(1)
        rhs = qn @ torch.einsum("bsc,hnc->bhsn", i["latent"].double(), w).transpose(-1, -2)
        if not torch.allclose(lhs, rhs, atol=1e-5, rtol=1e-4):
            _fail(name, f"with {desc}: (absorbed q)·c differs from q·(W_UK c).")
    return "3 cases: square and rectangular W_UK, batch 1 and 2, one head"


@_check
def check_absorbed_scores(absorbed_scores) -> str:
    """``absorbed_scores(q_nope, q_rope, latent, k_rope, w_uk, scale)`` → [B, h, T, S]: the pre-softmax
    scores (W_UK,mᵀ q_nope)·c_s + q_rope·k_R,s, times scale, computed from the latents without keys."""
    __tracebackhide__ = True
    name = "check_absorbed_scores"
    g = torch.Generator().manual_seed(9)
    for desc, B, h, T, S, dn, dc, dr, dv in _MLA_CASES:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        scale = (dn + dr) ** -0.5
        args = [i[k].clone() for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk")]
        got = _call(name, f"absorbed_scores with {desc}", absorbed_scores, *args, scale)
        want = _mla_naive64(i, scale)[0]
        def mk(i=i, scale=scale, **kw):
            return _mla_naive64(i, scale, **kw)[0]

        cands = [
            ("the RoPE part is missing: the score is q_nope·k_nope + q_rope·k_R (the shared, decoupled RoPE key).",
             partial(mk, rope=False)),
            ("the no-RoPE (latent) part is missing: add (W_UKᵀ q_nope)·c to q_rope·k_R.", partial(mk, nope=False)),
            ("the scale is not applied: multiply the scores by scale.", partial(mk, scale_mode="none")),
            ("the scale was applied twice.", partial(mk, scale_mode="twice")),
            ("the scale argument is ignored (1/sqrt(d_nope)): the key a head sees has d_nope + d_R dimensions; "
             "use the scale passed in.", partial(mk, scale_mode="nope")),
            ("the scale argument is ignored (1/sqrt(d_c)): use the scale passed in.", partial(mk, scale_mode="latent")),
            ("multiplied by W_UK,m instead of its transpose (absorb with W_UK,mᵀ q).", partial(mk, w_uk_t=True)
             if dn == dc else None),
        ]
        _judge(name, got, want, cands, f"with {desc}",
               hint="scores = (einsum('bhtn,hnc->bhtc', q_nope, w_uk) @ latentᵀ + q_rope @ k_ropeᵀ) · scale.")
    return "3 cases: square and rectangular W_UK, T < S, one head"


@_check
def check_mla_absorption(absorbed_attention) -> str:
    """``absorbed_attention(q_nope, q_rope, latent, k_rope, w_uk, w_uv, scale)`` → [B, h, T, d_v]: causal
    attention of the T newest positions over all S latents, absorbed, equal to the naive computation."""
    __tracebackhide__ = True
    name = "check_mla_absorption"
    g = torch.Generator().manual_seed(10)
    cases = _MLA_CASES + [("a chunk of 3 new tokens over 7 latents (T < S, causal with an offset)",
                           2, 2, 3, 7, 6, 6, 4, 6)]
    for desc, B, h, T, S, dn, dc, dr, dv in cases:
        i = _mla_inputs(g, B, h, T, S, dn, dc, dr, dv)
        scale = (dn + dr) ** -0.5
        args = [i[k].clone() for k in ("q_nope", "q_rope", "latent", "k_rope", "w_uk", "w_uv")]
        got = _call(name, f"absorbed_attention with {desc}", absorbed_attention, *args, scale)
        want = _mla_out64(*_mla_naive64(i, scale))

        def mk(i=i, scale=scale, **kw):
            return _mla_out64(*_mla_naive64(i, scale, **kw))

        cands = [
            ("no causal mask: query t (at position S-T+t) must not see later latents.", partial(mk, mask="none")),
            ("the causal mask is aligned to the top-left (is_causal=True with T < S): the T queries are the "
             "newest positions, so query t sees latents 0 .. S-T+t (tril(diagonal=S-T)).",
             partial(mk, mask="topleft") if 1 < T < S else None),
            ("the RoPE part of the score is missing (q_rope·k_R).", partial(mk, rope=False)),
            ("the latent part of the score is missing ((W_UKᵀ q_nope)·c).", partial(mk, nope=False)),
            ("the scale is not applied to the scores.", partial(mk, scale_mode="none")),
            ("softmax over the wrong axis: normalise over the latents (last dim).", partial(mk, softmax_dim=-2)),
            ("W_UV,m was not applied: the weighted sum of latents Σ_s p_s c_s lives in the latent space; head m's "
             "output is w_uv[m] @ (Σ_s p_s c_s).", partial(mk, no_uv=True)),
            ("W_UV,m was applied transposed: head m's value is W_UV,m c = w_uv[m] @ c, so the output is "
             "w_uv[m] @ (Σ_s p_s c_s).", partial(mk, w_uv_t=True) if dv == dc else None),
            ("multiplied by W_UK,m instead of its transpose when absorbing the query.",
             partial(mk, w_uk_t=True) if dn == dc else None),
        ]
        hint = ""
        if isinstance(got, torch.Tensor) and got.shape[:-1] == want.shape[:-1] and got.shape[-1] == dc and dc != dv:
            hint = ("The last dimension is d_c: that is the weighted sum of latents; map it to the head's value "
                    "space with W_UV,m (w_uv[m] @ mixed).")
        _judge(name, got, want, cands, f"with {desc}", hint=hint)
    return "4 cases: prefill, one new token, a chunk with offset mask, square and rectangular weights"


# ---- lesson 06: QK-norm ------------------------------------------------------------------------------


@_check
def check_qk_norm_rope(qk_norm_rope) -> str:
    """``qk_norm_rope(q, k, q_norm, k_norm, cos, sin)`` → (q, k): each head's q and k normalised by their
    own RMSNorm, then rotated by RoPE."""
    __tracebackhide__ = True
    name = "check_qk_norm_rope"
    g = torch.Generator().manual_seed(11)
    for desc, B, h, kv, T, dh in (("q [2, 4, 5, 8], k [2, 2, 5, 8]", 2, 4, 2, 5, 8),
                                  ("q [1, 2, 3, 16], k [1, 1, 3, 16] (one KV head)", 1, 2, 1, 3, 16)):
        qn, kn = _randomize(RMSNorm(dh), 50), _randomize(RMSNorm(dh), 51)
        q, k = torch.randn(B, h, T, dh, generator=g) * 3, torch.randn(B, kv, T, dh, generator=g) * 3
        cos, sin = rope_cache(T + 10, dh)
        cos, sin = cos[10:], sin[10:]
        out = _call(name, f"qk_norm_rope with {desc}", qk_norm_rope, q.clone(), k.clone(), qn, kn, cos, sin)
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            _fail(name, f"qk_norm_rope must return a pair (q, k), got {type(out).__name__}.")
        wq, wk = qn.weight.double(), kn.weight.double()

        def n(t, w):
            return _rms_norm64(t, w, 1e-6)

        def r(t, cos=cos, sin=sin):
            return _rope64(t, cos, sin)

        for which, got, x, w, w_other in (("q", out[0], q, wq, wk), ("k", out[1], k, wk, wq)):
            cands = [
                ("QK-norm after RoPE: normalise first, then rotate. With a learned per-feature scale the two "
                 "orders differ (the scale would act on rotated coordinates).", lambda x=x, w=w: n(r(x), w)),
                ("q_norm and k_norm were swapped: q goes through q_norm, k through k_norm.",
                 lambda x=x, w=w_other: r(n(x, w))),
                (f"{which} was not normalised: apply {which}_norm before RoPE.", lambda x=x: r(x)),
                (f"{which} was not rotated: apply RoPE after the norm.", lambda x=x, w=w: n(x, w)),
                ("the mean was subtracted (LayerNorm); QK-norm here is RMSNorm.",
                 lambda x=x, w=w: r(_rms_norm64(x, w, 1e-6, center=True))),
            ]
            _judge(name, got, r(n(x, w)), cands, f"{which} with {desc}",
                   hint=f"{which} = apply_rope({which}_norm({which}), cos, sin).")
    return "2 cases: GQA and one KV head, random norm scales"


@_check
def check_qk_norm_attention(QKNormAttentionClass) -> str:
    """``QKNormAttention(d, n_heads, n_kv_heads)``: GQA attention with per-head RMSNorm on q and k (before
    RoPE), attributes wq/wk/wv/wo/q_norm/k_norm, ``forward(x, cos, sin)``."""
    __tracebackhide__ = True
    name = "check_qk_norm_attention"
    hints = dict(_GQA_LOAD_HINTS)
    hints["q_norm"] = ("QK-norm normalises each head's vector: self.q_norm = RMSNorm(head_dim) and self.k_norm = "
                       "RMSNorm(head_dim), not RMSNorm(d) (and not LayerNorm, which has a bias).")
    hints["k_norm"] = hints["q_norm"]

    def make(d, h, kv, qk_norm):
        return _call(name, f"QKNormAttention({d}, {h}, {kv})", QKNormAttentionClass, d, h, kv)

    return _check_attention_module(name, make, qk_norm_cases=True, load_hints=hints)


# ---- lesson 07: the block and the model ---------------------------------------------------------------


def _block_candidates(ref: Block, x, cos, sin):
    n1, n2, attn, ffn = ref.attn_norm, ref.ffn_norm, ref.attn, ref.ffn

    def a(t):
        return attn(t, cos, sin)

    def post():
        y = n1(x + a(x))
        return n2(y + ffn(y))

    def seq(first_norm, second_norm, res1=True, res2=True):
        y = (x if res1 else 0) + a(first_norm(x) if first_norm else x)
        return (y if res2 else 0) + ffn(second_norm(y) if second_norm else y)

    def normed_stream():
        y = n1(x)
        y = y + a(y)
        z = n2(y)
        return z + ffn(z)

    return [
        ("post-norm (GPT-1 / original Transformer): the norm was applied after adding the residual. The modern "
         "block is pre-norm: x = x + attn(attn_norm(x)); x = x + ffn(ffn_norm(x)).", post),
        ("the attention residual is missing: x = x + attn(attn_norm(x), cos, sin).", lambda: seq(n1, n2, res1=False)),
        ("the FFN residual is missing: return x + ffn(ffn_norm(x)).", lambda: seq(n1, n2, res2=False)),
        ("both residual connections are missing: each sub-layer adds its output to x.",
         lambda: seq(n1, n2, False, False)),
        ("a parallel block (GPT-J style): the FFN reads the block's input, not x after the attention residual.",
         lambda: x + a(n1(x)) + ffn(n2(x))),
        ("the two norms were swapped: attention reads attn_norm(x), the FFN reads ffn_norm(x).",
         lambda: seq(n2, n1)),
        ("the residual stream itself was normalised (x = norm(x), then x + sublayer(x)): add the sub-layer's output "
         "to the un-normalised x.", normed_stream),
        ("attn_norm is not applied: attention must read attn_norm(x).", lambda: seq(None, n2)),
        ("ffn_norm is not applied: the FFN must read ffn_norm(x).", lambda: seq(n1, None)),
        ("the same norm (attn_norm) was used twice: the FFN has its own ffn_norm.", lambda: seq(n1, n1)),
    ]


@_check
def check_block(BlockClass) -> str:
    """``Block(d, n_heads, n_kv_heads, d_ff)``: pre-norm residual block with attn_norm, attn (GQAttention),
    ffn_norm, ffn (SwiGLU); ``forward(x, cos, sin)``."""
    __tracebackhide__ = True
    name = "check_block"
    g = torch.Generator().manual_seed(12)
    hints = {"attn_norm": "Name the parts attn_norm, attn, ffn_norm and ffn (RMSNorm, GQAttention, RMSNorm, "
                          "SwiGLU).",
             "ffn.": "self.ffn = SwiGLU(d, d_ff)."}
    cases = [("d=32, 4 heads over 2 KV heads, d_ff=48, x of shape [2, 6, 32]", 32, 4, 2, 48, 2, 6),
             ("d=16, MQA (2 heads over 1), d_ff=40, batch 1, one token", 16, 2, 1, 40, 1, 1),
             ("d=24, 3 heads, MHA, d_ff=64, x of shape [1, 7, 24]", 24, 3, 3, 64, 1, 7)]
    for k, (desc, d, h, kv, d_ff, B, T) in enumerate(cases):
        ref = _randomize(Block(d, h, kv, d_ff), 60 + k)
        student = _call(name, f"Block({d}, {h}, {kv}, {d_ff})", BlockClass, d, h, kv, d_ff)
        _load(name, student, ref, hints)
        x = torch.randn(B, T, d, generator=g) * 2
        cos, sin = rope_cache(T, d // h)
        got = _call(name, f"forward(x, cos, sin) with {desc}", student, x.clone(), cos, sin)
        want = ref(x, cos, sin)
        _judge(name, got, want, _block_candidates(ref, x, cos, sin), f"with {desc}", atol=5e-5, rtol=1e-4,
               hint="x = x + attn(attn_norm(x), cos, sin); return x + ffn(ffn_norm(x)).")
    return "3 cases: GQA, MQA with one token, MHA"


_CHAPTER_PARAMS = 3_283_456


@_check
def check_llama_lm(LlamaStyleLMClass) -> str:
    """``LlamaStyleLM(V, d=256, n_layers=4, n_heads=8, n_kv_heads=2, d_ff=688, max_len=1024,
    rope_base=10000.0, tie=False)``: emb, blocks, norm, head, non-persistent cos/sin buffers;
    ``forward(idx)`` → logits [B, T, V]."""
    __tracebackhide__ = True
    name = "check_llama_lm"
    model = _call(name, "LlamaStyleLM(V=1000)", LlamaStyleLMClass, 1000)
    n = count_parameters(model)
    if n != _CHAPTER_PARAMS:
        deltas = {
            -256_000: "the head is tied by default: tie=False is the default (the chapter's 3,283,456 is untied).",
            -256: "the final RMSNorm (self.norm, before the head) is missing.",
            1000: "the output head has a bias; use nn.Linear(d, V, bias=False).",
            262_144: "a learned position embedding (1024 × 256) was added; RoPE replaces it (no parameters).",
            256_000: "an extra V × d matrix: emb and head only (and tie=False means two of them, not three).",
        }
        diag = deltas.get(n - _CHAPTER_PARAMS, "compare your modules with the chapter's: emb, 4 blocks, norm, head.")
        _fail(name, f"LlamaStyleLM(V=1000) has {n:,} parameters; the chapter's model has {_CHAPTER_PARAMS:,}.\n"
                    f"Likely mistake: {diag}")
    tied = _call(name, "LlamaStyleLM(V=1000, tie=True)", LlamaStyleLMClass, 1000, tie=True)
    head, emb = getattr(tied, "head", None), getattr(tied, "emb", None)
    if head is None or emb is None or head.weight is not emb.weight:
        _fail(name, "with tie=True, head.weight must be the same Parameter as emb.weight (self.head.weight = "
                    "self.emb.weight), not a copy: one matrix, two uses.")
    if count_parameters(tied) != _CHAPTER_PARAMS - 256_000:
        _fail(name, f"with tie=True the model has {count_parameters(tied):,} parameters; expected "
                    f"{_CHAPTER_PARAMS - 256_000:,} (V·d = 256,000 fewer).")
    g = torch.Generator().manual_seed(13)
    cases = [("V=50, d=32, 2 layers, 4 heads over 2 KV heads, idx of shape [2, 7]", dict(), 2, 7),
             ("the same model with tie=True, batch 1, one token", dict(tie=True), 1, 1),
             ("rope_base=500000, idx of shape [1, 16] (= max_len)", dict(rope_base=500000.0), 1, 16)]
    for k, (desc, kw, B, T) in enumerate(cases):
        cfg = dict(V=50, d=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_len=16, **kw)
        ref = _randomize(LlamaStyleLM(**cfg), 70 + k)
        if cfg.get("tie"):
            ref.head.weight = ref.emb.weight
        student = _call(name, f"LlamaStyleLM({', '.join(f'{a}={b}' for a, b in cfg.items())})",
                        LlamaStyleLMClass, **cfg)
        extra = {key for key, _ in student.named_buffers()} & {"cos", "sin"}
        persistent = extra & set(student.state_dict())
        if persistent:
            _fail(name, "the RoPE tables are saved with the weights: register them with "
                        "self.register_buffer('cos', cos, persistent=False) (they are recomputed, not learned).")
        _load(name, student, ref, {"emb": "Name the parts emb, blocks, norm and head.",
                                   "blocks.": "self.blocks = nn.ModuleList(Block(...) for _ in range(n_layers)).",
                                   "unexpected cos": "The RoPE tables are computed, not learned: register them "
                                                     "with persistent=False so they are not saved as weights.",
                                   "unexpected sin": "The RoPE tables are computed, not learned: register them "
                                                     "with persistent=False so they are not saved as weights."})
        if cfg.get("tie") and student.head.weight is not student.emb.weight:
            _fail(name, "after loading weights the head is no longer tied to the embedding.")
        idx = torch.randint(0, 50, (B, T), generator=g)
        got = _call(name, f"forward(idx) with {desc}", student, idx.clone())
        want = ref(idx)

        def no_final_norm(ref=ref, idx=idx):
            x = ref.emb(idx)
            for blk in ref.blocks:
                x = blk(x, ref.cos[:idx.shape[1]], ref.sin[:idx.shape[1]])
            return ref.head(x)

        def base_10k(ref=ref, idx=idx):
            c, s = rope_cache(16, 8)
            x = ref.emb(idx)
            for blk in ref.blocks:
                x = blk(x, c[:idx.shape[1]], s[:idx.shape[1]])
            return ref.head(ref.norm(x))

        cands = [("the final RMSNorm is missing: logits = head(norm(x)).", no_final_norm),
                 ("softmax was applied: forward returns logits, not probabilities.", want.softmax(-1)),
                 ("log-softmax was applied: forward returns raw logits.", want.log_softmax(-1))]
        if cfg.get("rope_base", 10000.0) != 10000.0:
            cands.append(("rope_base is ignored: build the tables with rope_cache(max_len, head_dim, rope_base).",
                          base_10k))
        _judge(name, got, want, cands, f"with {desc}", atol=5e-5, rtol=1e-4,
               hint="x = emb(idx); each block gets cos[:T], sin[:T]; logits = head(norm(x)).")
    return "3,283,456 parameters, tying, 3 forward cases incl. rope_base and T = max_len"


def _param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie, qk_norm, *, kv_full=False, norms=True,
                 qk=True, head=True, final=True, head_when_tied=False):
    dh = d // n_heads
    kv = n_heads if kv_full else n_kv_heads
    attn = d * n_heads * dh + 2 * d * kv * dh + n_heads * dh * d + (2 * dh if qk_norm and qk else 0)
    layer = attn + 3 * d * d_ff + (2 * d if norms else 0)
    total = V * d + n_layers * layer + (d if final and norms else 0)
    if head and (not tie or head_when_tied):
        total += V * d
    return total


@_check
def check_llama_param_count(llama_param_count) -> str:
    """``llama_param_count(V, d, n_layers, n_heads, n_kv_heads, d_ff, tie=False, qk_norm=True)``: the
    parameters of LlamaStyleLM, by formula."""
    __tracebackhide__ = True
    name = "check_llama_param_count"
    cases = [((1000, 256, 4, 8, 2, 688), {}), ((1000, 256, 4, 8, 2, 688), dict(tie=True)),
             ((1000, 256, 4, 8, 2, 688), dict(qk_norm=False)), ((500, 64, 3, 4, 1, 160), {}),
             ((32000, 4096, 32, 32, 32, 11008), dict(qk_norm=False)), ((300, 48, 2, 6, 3, 128), dict(tie=True))]
    for args, kw in cases:
        tie, qk_norm = kw.get("tie", False), kw.get("qk_norm", True)
        call = f"llama_param_count{args}" + "".join(f", {k}={v}" for k, v in kw.items())
        got = _call(name, call, llama_param_count, *args, **kw)
        want = _param_count(*args, tie, qk_norm)
        pc = partial(_param_count, *args, tie, qk_norm)
        cands = [
            ("wk and wv counted at full size: with GQA they have n_kv_heads·head_dim outputs, not d.",
             pc(kv_full=True)),
            ("the RMSNorm scales were not counted: 2·d per block plus d for the final norm (and 2·head_dim per block "
             "for QK-norm).", pc(norms=False, qk=False)),
            ("the per-block RMSNorm scales (2·d) and the final norm (d) were not counted.", pc(norms=False)),
            ("the QK-norm scales were not counted: q_norm and k_norm have head_dim weights each, per block.",
             pc(qk=False)),
            ("the QK-norm scales were counted although qk_norm=False.",
             _param_count(*args, tie, True) if not qk_norm else None),
            ("the tied head was counted a second time: with tie=True the head is the embedding matrix.",
             pc(head_when_tied=True) if tie else None),
            ("the output head (V·d) was not counted.", pc(head=False) if not tie else None),
            ("the final norm (d) was not counted.", pc(final=False)),
        ]
        _judge_int(name, got, want, cands, call,
                   hint="emb V·d; per block: wq d·h·dh, wk and wv d·n_kv·dh each, wo h·dh·d, 2·dh QK-norm, "
                        "3·d·d_ff, 2·d norms; final norm d; head V·d unless tied.")
    return "6 cases incl. the chapter's 3,283,456, tied, no QK-norm, MQA and Llama 2 7B's 6,738,415,616"
