"""Lesson 09b: RoPE scaling for a longer context (Llama 3's rule, the NTK-aware base)."""

from __future__ import annotations

import math
from functools import partial

import torch

from ...rope import rope_frequencies
from .core import call_student, exercise_check, generator, is_graded, judge, judge_number, pick, require_dtype


def _llama3_64(theta, s, low, high, L0, *, mistake=None):
    """Llama 3's rule in float64, with one knob per common mistake."""
    theta = theta.double()
    wavelength = (1 / theta) if mistake == "no_2pi" else 2 * math.pi / theta
    if mistake == "frequency_as_wavelength":  # thresholds compared with θ itself
        wavelength = theta
    short_edge, long_edge = L0 / high, L0 / low
    if mistake == "bands_swapped":
        short_edge, long_edge = long_edge, short_edge
    turns = wavelength / L0 if mistake == "turns_inverted" else L0 / wavelength
    a = (turns - low) / (high - low)
    slow = theta * s if mistake == "multiplied" else theta / s
    blended = {"blend_reversed": a * slow + (1 - a) * theta, "middle_kept": theta,
               "middle_divided": slow}.get(mistake, (1 - a) * slow + a * theta)
    if mistake == "scale_all":
        return theta / s
    return torch.where(wavelength < short_edge, theta, torch.where(wavelength > long_edge, slow, blended))


_LLAMA3_CASES = [  # (what, d_h, base, factor, low_freq_factor, high_freq_factor, original_len)
    ("Llama 3.1 8B", 128, 500000.0, 8.0, 1.0, 4.0, 8192),
    ("Llama 3.2 1B", 64, 500000.0, 32.0, 1.0, 4.0, 8192),
    ("a small head with all three bands", 32, 10000.0, 4.0, 2.0, 8.0, 256),
]

_LLAMA3_MISTAKES = [
    ("scale_all", "every frequency was divided by the factor: that is position interpolation. Llama 3 keeps the "
                  "short waves (wavelength < original_len / high_freq_factor) as they are and divides only the long "
                  "ones (wavelength > original_len / low_freq_factor)."),
    ("bands_swapped", "the middle band was left unscaled, as when the two thresholds are swapped (the wrong "
                      "smoothing band): short waves are those with wavelength < original_len / high_freq_factor, "
                      "long waves those with wavelength > original_len / low_freq_factor; the band in between is "
                      "blended."),
    ("frequency_as_wavelength", "the frequencies came back unscaled: apply Llama 3's rule to θ_i = base^(-2i/dh). "
                                "(Comparing θ itself with the wavelength thresholds, wavelength vs frequency, gives "
                                "this too: every θ ≤ 1 then counts as a short wave. Convert first: wavelength = "
                                "2π / θ, in tokens per full turn.)"),
    ("no_2pi", "the wavelength was taken as 1/θ: a full turn is 2π radians, so the wavelength is 2π / θ tokens."),
    ("turns_inverted", "the blend weight uses wavelength / original_len; it uses the number of turns in the "
                       "original context, original_len / wavelength: a = (original_len / wavelength - low) / "
                       "(high - low)."),
    ("blend_reversed", "the blend is reversed: a = (original_len / wavelength - low) / (high - low) weights the "
                       "unscaled θ (a = 1 at the short edge), and 1 - a weights θ / factor."),
    ("middle_divided", "the middle band was divided like the long waves: between the two thresholds θ is blended, "
                       "(1 - a)·θ/factor + a·θ."),
    ("multiplied", "the long waves' frequencies were multiplied by the factor; divide them (a slower rotation "
                   "stretches the wavelength so the longer context fits)."),
]


@exercise_check(components=("llama3_frequencies", "scaled_frequencies", "rope_cache", "rope_frequencies"))
def check_llama3_rope_scaling(llama3_frequencies_fn) -> str:
    """``llama3_frequencies(dh, base, factor, low_freq_factor, high_freq_factor, original_len)`` → a model's
    RoPE frequencies θ_i = base^(-2i/dh), float32 [dh/2], scaled by Llama 3.1's piecewise rule by wavelength."""
    __tracebackhide__ = True
    name = "check_llama3_rope_scaling"
    cases = list(_LLAMA3_CASES)
    if is_graded():  # a hidden context length, factor and band
        g = generator(9)
        low, high = pick(g, [(1.0, 4.0), (1.0, 2.0), (2.0, 8.0)])
        cases.append(("a hidden configuration", 64, pick(g, [10000.0, 500000.0]), pick(g, [4.0, 8.0, 16.0]),
                      low, high, pick(g, [2048, 4096, 16384])))
    for what, dh, base, s, low, high, L0 in cases:
        theta = rope_frequencies(dh, base)  # [dh/2], float32
        call = (f"llama3_frequencies({dh}, {base:g}, factor={s:g}, low_freq_factor={low:g}, "
                f"high_freq_factor={high:g}, original_len={L0}) ({what})")
        got = call_student(name, call, llama3_frequencies_fn, dh, base, s, low, high, L0)
        want = _llama3_64(theta, s, low, high, L0)
        cands = [(diag, partial(_llama3_64, theta, s, low, high, L0, mistake=m)) for m, diag in _LLAMA3_MISTAKES]
        cands += [("the exponent of the frequencies is i/dh: θ_i = base^(-2i/dh) for pair i = 0 .. dh/2-1.",
                   partial(_llama3_64, base ** (-torch.arange(dh // 2, dtype=torch.float64) / dh), s, low, high, L0))]
        judge(name, got, want, cands, call, rtol=1e-5, atol=0,
              hint="wavelength = 2π/θ; keep θ below original_len/high_freq_factor, divide it by the factor above "
                   "original_len/low_freq_factor, blend in between.")
        require_dtype(name, got, theta.dtype, call, "the output", "return float32 frequencies.")
    return f"{len(cases)} configurations incl. Llama 3.1 8B and Llama 3.2 1B, every band populated"


@exercise_check(components=("dynamic_ntk_frequencies",))
def check_ntk_scaled_base(ntk_scaled_base_fn) -> str:
    """``ntk_scaled_base(base, dh, kappa)`` → b' = base · kappa^(dh/(dh-2)), the NTK-aware base that keeps the
    fastest pair and divides the slowest one's frequency by exactly kappa."""
    __tracebackhide__ = True
    name = "check_ntk_scaled_base"
    cases = [(10000.0, 128, 4.0), (500000.0, 64, 2.0), (10000.0, 16, 8.0)]
    if is_graded():
        g = generator(10)
        cases.append((pick(g, [10000.0, 100000.0, 1000000.0]), pick(g, [32, 64, 96]), pick(g, [1.5, 3.0, 16.0])))
    for base, dh, kappa in cases:
        call = f"ntk_scaled_base({base:g}, {dh}, {kappa:g})"
        got = call_student(name, call, ntk_scaled_base_fn, base, dh, kappa)
        want = base * kappa ** (dh / (dh - 2))
        cands = [
            ("the exponent d_h/(d_h - 2) is missing: with base·kappa the slowest pair is divided by only "
             "kappa^((d_h - 2)/d_h).", base * kappa),
            ("the exponent is upside down: it is d_h/(d_h - 2), slightly above 1.", base * kappa ** ((dh - 2) / dh)),
            ("the base must grow to slow the rotations down: multiply by kappa^(d_h/(d_h - 2)), do not divide.",
             base / kappa ** (dh / (dh - 2))),
            ("kappa was raised to d_h/2: the exponent is d_h/(d_h - 2).", base * kappa ** (dh / 2)),
        ]
        judge_number(name, got, want, cands, call, rel=1e-6,
                     hint="the slowest pair's frequency is b^(-(d_h-2)/d_h); solve for the base that divides it "
                          "by kappa.")
    return f"{len(cases)} cases: Llama 2-style, Llama 3-style and a 16-dimensional head"
